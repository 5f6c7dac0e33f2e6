"""`python -m bench.webhook_client [--deliveries N] [--concurrency C] [--runs R]`: the CPU
cost of one webhook delivery in the client, for the webhook clients jobq could use, each
keeping every guarantee of a delivery: resolve and check the host (the SSRF guard) and connect
to the checked address, no redirects, the answer read raw up to a limit, per-read and
whole-attempt deadlines, Standard Webhooks signatures.

- `aiohttp`: jobq's client (`jobq.jobs.reminders.deliver` without its database hold:
  `resolve_target`, `pinned`, `post_webhook` on `jobq.domain.webhooks.webhook_client`).
- `httpx`: httpx as jobq configured it before (httpcore's pool with a network backend that
  resolves, checks and connects to the checked address; 20 idle connections kept for 5 s), the
  same steps around it.
- `httpx-keepalive`: the same, with HTTP/1.1 keep-alive tuned: 64 idle connections kept 60 s.

The receiver (`tests.toolkit.receiver`, keep-alive) runs in a process of its own, so the
figure is the client's CPU alone: this process's CPU time (user + system) over the deliveries,
on uvloop as the service runs. Each variant runs `--runs` times, interleaved; the median is
printed, one JSON line per variant.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import timedelta
from typing import Any

import httpcore
import httpx

from jobq import clock
from jobq.__main__ import run
from jobq.config import PROJECT_ROOT, Settings
from jobq.domain import signing, webhooks
from jobq.errors import UnsafeWebhook
from jobq.jobs.reminders import post_webhook

SECRET = "whsec_YmVuY2gtd2ViaG9vay1zZWNyZXQtb2YtMzItYnl0ZXM="  # noqa: S105 (a benchmark's value)
BODY = json.dumps(
    {
        "reminder_id": 123456,
        "user_id": 4242,
        "message": "stand up and stretch",
        "remind_at": "2031-03-04T10:00:00Z",
        "attempt": 1,
    }
).encode()
RECEIVER = """
import asyncio, sys
from tests.toolkit.receiver import WebhookReceiver
async def main():
    receiver = WebhookReceiver()
    await receiver.start()
    print(receiver.port, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
asyncio.run(main())
"""

Deliver = Callable[[str], Awaitable[int]]


def settings() -> Settings:
    return Settings(
        _env_file=None,
        webhook_secret=SECRET,
        webhook_allow_private=True,  # the receiver is on 127.0.0.1; the checks still run
        webhook_total_timeout=timedelta(seconds=15),
    )


async def aiohttp_variant(config: Settings) -> tuple[Deliver, Callable[[], Awaitable[Any]]]:
    client = webhooks.webhook_client(config)
    total = config.webhook_total_timeout.total_seconds()

    async def deliver(url: str) -> int:
        async with asyncio.timeout(total):
            target = await webhooks.resolve_target(url, config)
            with webhooks.pinned(target):
                status, _ = await post_webhook(client, url, BODY, settings=config, msg_id="m")
        return status

    return deliver, client.close


class _GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend as jobq's httpx client had it: connect only to the pinned,
    checked address (or resolve and check)."""

    def __init__(self, config: Settings) -> None:
        self._config = config
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        target = webhooks._PINNED.get()
        try:
            if target is not None and (target.host, target.port) == (host.strip("[]"), port):
                if any(webhooks.refusal(a, port, self._config) for a in target.addresses):
                    raise UnsafeWebhook("refused")
                address = target.address
            else:
                [address, *_] = await webhooks.checked_addresses(host, port, self._config)
        except UnsafeWebhook as exc:
            raise httpcore.ConnectError(exc.message) from exc
        return await self._inner.connect_tcp(address, port, timeout, local_address, socket_options)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("webhooks do not use Unix sockets")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _GuardedTransport(httpx.AsyncHTTPTransport):
    def __init__(self, config: Settings, keepalive: int, expiry_s: float) -> None:
        super().__init__()
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(),
            max_connections=None,
            max_keepalive_connections=keepalive,
            keepalive_expiry=expiry_s,
            network_backend=_GuardedBackend(config),
        )


async def httpx_variant(
    config: Settings, keepalive: int, expiry_s: float
) -> tuple[Deliver, Callable[[], Awaitable[Any]]]:
    connect = config.webhook_connect_timeout.total_seconds()
    read = config.webhook_timeout.total_seconds()
    client = httpx.AsyncClient(
        transport=_GuardedTransport(config, keepalive, expiry_s),
        timeout=httpx.Timeout(connect=connect, read=read, write=read, pool=connect),
        follow_redirects=False,
        trust_env=False,
    )
    assert config.webhook_secret is not None
    secret = config.webhook_secret.get_secret_value()
    limit = config.webhook_max_response_bytes
    total = config.webhook_total_timeout.total_seconds()

    async def deliver(url: str) -> int:
        async with asyncio.timeout(total):
            target = await webhooks.resolve_target(url, config)
            with webhooks.pinned(target):
                headers = {
                    "Content-Type": "application/json",
                    **signing.signature_headers(secret, "m", BODY, clock.now()),
                }
                request = client.build_request("POST", url, content=BODY, headers=headers)
                response = await client.send(request, stream=True, follow_redirects=False)
                try:
                    size = 0
                    async for chunk in response.aiter_raw():
                        size += len(chunk)
                        if size > limit:
                            break
                finally:
                    await response.aclose()
        return response.status_code

    return deliver, client.aclose


async def measure(
    deliver: Deliver, url: str, deliveries: int, concurrency: int
) -> dict[str, float]:
    """Deliver `deliveries` times, `concurrency` at once (a worker's slots); return the CPU
    time per delivery (µs) and the rate (deliveries/s)."""
    queue = iter(range(deliveries))

    async def slot() -> None:
        for _ in queue:
            assert await deliver(url) == 200

    for _ in range(concurrency * 4):  # warm up: connections, caches
        await deliver(url)
    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(slot() for _ in range(concurrency)))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {"cpu_us_per_delivery": cpu / deliveries * 1e6, "deliveries_per_s": deliveries / wall}


async def compare(url: str, deliveries: int, concurrency: int, runs: int) -> None:
    """Run each variant `runs` times against `url`, interleaved; print the medians."""
    config = settings()
    variants: dict[str, Callable[[], Awaitable[tuple[Deliver, Any]]]] = {
        "aiohttp": lambda: aiohttp_variant(config),
        "httpx": lambda: httpx_variant(config, 20, 5.0),
        "httpx-keepalive": lambda: httpx_variant(config, 64, 60.0),
    }
    results: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    for _ in range(runs):
        for name, make in variants.items():
            deliver, close = await make()
            try:
                results[name].append(await measure(deliver, url, deliveries, concurrency))
            finally:
                await close()
    for name, figures in results.items():
        line = {
            "bench": "webhook_client",
            "client": name,
            "deliveries": deliveries,
            "concurrency": concurrency,
            **{k: round(statistics.median(f[k] for f in figures), 1) for k in figures[0]},
        }
        print(json.dumps(line), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deliveries", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--runs", type=int, default=3)
    options = parser.parse_args()
    receiver = subprocess.Popen(  # noqa: S603 (our own interpreter and script)
        [sys.executable, "-c", RECEIVER],
        cwd=PROJECT_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert receiver.stdout is not None
        url = f"http://127.0.0.1:{receiver.stdout.readline().strip()}/hook"
        run(compare(url, options.deliveries, options.concurrency, options.runs))
    finally:
        receiver.communicate("", timeout=10)


if __name__ == "__main__":
    main()
