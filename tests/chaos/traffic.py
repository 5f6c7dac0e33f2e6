"""HTTP traffic against a `python -m jobq serve` subprocess, every request recorded."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field

import httpx

from tests.toolkit.procs import Proc, Procs

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
    """`loops` clients, each in turn creating a user, reading it back (with its API key) and
    asking /health, with
    a pause of `pause_s` between rounds, until `stop`."""

    base_url: str
    loops: int = 2
    pause_s: float = 0.02
    requests: list[Request] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def _send(
        self, http: httpx.AsyncClient, method: str, path: str, **kw: object
    ) -> tuple[int, str]:
        """Send one request and record it; return the id and API key it created (a 201 from
        `POST /users`), else `(0, "")`."""
        started = time.monotonic()
        status: int | None = None
        error = None
        created: dict[str, object] = {}
        try:
            response = await http.request(method, path, **kw)  # type: ignore[arg-type]
            status = response.status_code
            created = response.json() if status == 201 else {}
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"
        self.requests.append(
            Request(method, path, started, time.monotonic() - started, status, error)
        )
        return int(str(created.get("id", 0))), str(created.get("api_key", ""))

    async def _loop(self, http: httpx.AsyncClient) -> None:
        while not self.stop.is_set():
            email = f"chaos-{uuid.uuid4().hex[:12]}@example.com"
            user_id, key = await self._send(
                http, "POST", "/users", json={"name": "Chaos", "email": email}
            )
            if user_id:
                await self._send(
                    http, "GET", f"/users/{user_id}", headers={"Authorization": f"Bearer {key}"}
                )
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


async def start_api(procs: Procs, env: dict[str, str]) -> tuple[Proc, str]:
    """Start `python -m jobq serve` without a worker; return it and its base URL once /health
    answers 200."""
    api, port = await procs.serve("api", {**env, "JOBQ_RUN_WORKERS": "false"})
    return api, f"http://127.0.0.1:{port}"
