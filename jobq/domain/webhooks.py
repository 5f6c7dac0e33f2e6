"""The webhook SSRF guard: where jobq may send a user's reminders.

Unless `webhook_allow_private` (local development), a webhook URL must be `http` or `https`,
use a port of `webhook_ports`, and every address its host resolves to must be public: not
unspecified (`0.0.0.0`, `::`), loopback, link-local (`169.254.0.0/16`, `fe80::/10`),
multicast, private (RFC 1918, `fc00::/7`, `100.64.0.0/10`, ...), site-local or reserved, nor
an IPv4-mapped IPv6 spelling of one (`::ffff:127.0.0.1`). Other spellings of an IPv4 address
(`2130706433`, `0177.0.0.1`, `0x7f.1`) are normalised by the URL parser and by the resolver,
and checked as the address they name.

The check runs twice: when a URL is registered (`check_url`: 422 naming the reason), and at
every delivery inside the HTTP client (`webhook_transport`): its network backend resolves the
name itself, checks every address, and connects to the checked one; TLS still verifies the
name. A name that resolves to a private address at delivery (DNS rebinding) is refused
there, before any connection. Redirects are never followed (see `jobq.jobs.reminders`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable

import httpcore
import httpx

from jobq.config import Settings
from jobq.errors import UnsafeWebhook

_CATEGORIES = (
    "unspecified",
    "loopback",
    "link_local",
    "multicast",
    "reserved",
    "site_local",
    "private",
)


async def resolve(host: str, port: int) -> list[str]:
    """Return the IP addresses (text) `host` resolves to for TCP, as the system resolver
    answers (an IP literal resolves to itself). Raises: `OSError` (`socket.gaierror`)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def refusal(address: str, port: int, settings: Settings) -> str | None:
    """Return why a webhook may not connect to `address` (an IP, text) on `port`, or None when
    it may. Always None with `settings.webhook_allow_private`."""
    if settings.webhook_allow_private:
        return None
    if port not in settings.webhook_ports:
        allowed = ", ".join(str(p) for p in sorted(settings.webhook_ports))
        return f"port {port} is not allowed (allowed: {allowed})"
    ip = ipaddress.ip_address(address.partition("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for category in _CATEGORIES:
        if getattr(ip, f"is_{category}", False):
            return f"{address} is a {category.replace('_', '-')} address"
    if not ip.is_global:
        return f"{address} is not a public address"
    return None


async def checked_addresses(host: str, port: int, settings: Settings) -> list[str]:
    """Resolve `host` and return its addresses when every one of them is allowed on `port`.
    Raises: `UnsafeWebhook` naming the first refused address, or when `host` does not
    resolve."""
    try:
        addresses = await resolve(host.strip("[]"), port)
    except OSError as exc:
        raise UnsafeWebhook(f"webhook host {host} does not resolve ({exc})") from exc
    if not addresses:
        raise UnsafeWebhook(f"webhook host {host} does not resolve")
    for address in addresses:
        reason = refusal(address, port, settings)
        if reason is not None:
            raise UnsafeWebhook(f"webhook refused: {host} -> {reason}")
    return addresses


async def check_url(url: str, settings: Settings) -> None:
    """Check a webhook URL at registration (see the module); nothing to check (no lookup)
    with `webhook_allow_private`. Raises: `UnsafeWebhook` (422)."""
    if settings.webhook_allow_private:
        return
    parsed = httpx.URL(url)
    if parsed.scheme not in ("http", "https"):
        raise UnsafeWebhook("webhook_url must be http or https")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    await checked_addresses(parsed.host, port, settings)


class _GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend, connecting only to checked addresses."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                addresses = await checked_addresses(host, port, self._settings)
        except UnsafeWebhook as exc:
            raise httpcore.ConnectError(exc.message) from exc
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(f"resolving {host} timed out") from exc
        return await self._inner.connect_tcp(
            addresses[0], port, timeout, local_address, socket_options
        )

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("webhooks do not use Unix sockets")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


WEBHOOK_LIMITS = httpx.Limits(
    max_connections=None, max_keepalive_connections=20, keepalive_expiry=5
)
"""The webhook client's connection pool: no cap on connections, since a worker's slots already
bound its deliveries, and a lower cap held deliveries to healthy hosts behind those waiting on
slow ones until the pool's timeout failed them (httpcore's own default, 10, is below a worker's
16 slots); idle connections kept as httpx keeps them by default (20, for 5 s)."""


class _GuardedTransport(httpx.AsyncHTTPTransport):
    def __init__(self, settings: Settings) -> None:
        super().__init__()
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(),
            max_connections=WEBHOOK_LIMITS.max_connections,
            max_keepalive_connections=WEBHOOK_LIMITS.max_keepalive_connections,
            keepalive_expiry=WEBHOOK_LIMITS.keepalive_expiry,
            network_backend=_GuardedBackend(settings),
        )


def webhook_client(settings: Settings, timeout: httpx.Timeout) -> httpx.AsyncClient:
    """An `httpx.AsyncClient` for webhook calls: the guarded transport (see the module), with
    `WEBHOOK_LIMITS`, no redirects, no proxies from the environment (a proxy would connect on
    the guard's behalf), `timeout`. Close it (`async with`) when done."""
    return httpx.AsyncClient(
        transport=_GuardedTransport(settings),
        timeout=timeout,
        follow_redirects=False,
        trust_env=False,
    )
