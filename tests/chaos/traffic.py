"""HTTP traffic against a `python -m jobq serve` subprocess, every request recorded."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field

import httpx

from jobq.db import Connection
from tests.chaos.helpers import Procs
from tests.chaos.server import free_port
from tests.procs import Proc, eventually

TIMEOUT_S = 15.0
"""The client's timeout: far beyond what an answer may take, so that a hang shows as one."""


@dataclass(frozen=True)
class Request:
    """One request: what, when (monotonic), how long, and its status (None: transport error)."""

    method: str
    path: str
    started: float
    took_s: float
    status: int | None
    error: str | None


@dataclass
class Traffic:
    """`loops` clients, each in turn creating a user, reading it back and asking /health, with
    a pause of `pause_s` between rounds, until `stop`."""

    base_url: str
    loops: int = 2
    pause_s: float = 0.02
    requests: list[Request] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def _send(self, http: httpx.AsyncClient, method: str, path: str, **kw: object) -> int:
        started = time.monotonic()
        status: int | None = None
        error = None
        try:
            response = await http.request(method, path, **kw)  # type: ignore[arg-type]
            status = response.status_code
            user_id = response.json().get("id") if status == 201 else None
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"
            user_id = None
        self.requests.append(
            Request(method, path, started, time.monotonic() - started, status, error)
        )
        return int(user_id or 0)

    async def _loop(self, http: httpx.AsyncClient) -> None:
        while not self.stop.is_set():
            email = f"chaos-{uuid.uuid4().hex[:12]}@example.com"
            user_id = await self._send(
                http, "POST", "/users", json={"name": "Chaos", "email": email}
            )
            if user_id:
                await self._send(http, "GET", f"/users/{user_id}")
            await self._send(http, "GET", "/health")
            await asyncio.sleep(self.pause_s)

    async def run(self) -> None:
        async with httpx.AsyncClient(base_url=self.base_url, timeout=TIMEOUT_S) as http:
            await asyncio.gather(*(self._loop(http) for _ in range(self.loops)))

    def between(self, start: float, end: float) -> list[Request]:
        """Requests started in [start, end] (monotonic)."""
        return [r for r in self.requests if start <= r.started <= end]

    def first_ok_health_after(self, start: float) -> Request | None:
        return next(
            (
                r
                for r in self.requests
                if r.path == "/health" and r.status == 200 and r.started >= start
            ),
            None,
        )


async def start_api(procs: Procs, conn: Connection, env: dict[str, str]) -> tuple[Proc, str]:
    """Start `python -m jobq serve` without a worker; return it and its base URL once /health
    answers 200."""
    port = free_port()
    api = procs.start(
        "serve",
        "api",
        {
            **env,
            "JOBQ_HTTP_HOST": "127.0.0.1",
            "JOBQ_HTTP_PORT": str(port),
            "JOBQ_RUN_WORKERS": "false",
        },
    )
    base_url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=base_url, timeout=5) as http:

        async def healthy() -> bool:
            try:
                return (await http.get("/health")).status_code == 200
            except httpx.TransportError:
                return False

        await eventually(healthy, within=20, what="the API to answer", running=(api,))
    return api, base_url
