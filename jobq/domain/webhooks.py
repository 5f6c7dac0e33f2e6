"""The webhook SSRF guard: where jobq may send a user's reminders.

Unless `webhook_allow_private` (local development), a webhook URL must be `http` or `https`,
use a port of `webhook_ports`, and every address its host resolves to must be public: not
unspecified, loopback, link-local, multicast, private, site-local or reserved, not in a block
of IANA's special-purpose address registries (`192.0.0.0/24`, `198.18.0.0/15`, `100.64.0.0/10`,
`2001::/23`, `3fff::/20`, ...: `SPECIAL_PURPOSE`, checked here because Python's own
`is_global` table differs between versions), and global by `ipaddress`'s `is_global`. An IPv6
address that embeds an IPv4 one (IPv4-mapped `::ffff:127.0.0.1`, 6to4 `2002:7f00:1::`, NAT64
`64:ff9b::7f00:1`, Teredo's server and client) is refused when the IPv4 one is. Other spellings
of an IPv4 address (`2130706433`, `0177.0.0.1`, `0x7f.1`) are normalised by the URL parser and
by the resolver, and checked as the address they name. A refusal says why by the address's
class and never names the address (an anonymous caller learns nothing of internal names).

The check runs when a URL is registered (`check_url`: 422) and at every delivery attempt,
before any byte is sent (`resolve_target`: the delivery resolves the name once, checks every
address, and pins the connection to the checked one with `pinned`); the client's network
resolver (`webhook_client`) checks again whatever it connects to, so a name that resolves to a
private address at delivery (DNS rebinding, or a URL stored while the guard was off) is refused
there. TLS still verifies the name. Every lookup is bounded by `webhook_connect_timeout`.
Redirects are never followed (see `jobq.jobs.reminders`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from jobq.config import Settings
from jobq.errors import UnsafeWebhook

log = logging.getLogger(__name__)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_CATEGORIES = (
    "unspecified",
    "loopback",
    "link_local",
    "multicast",
    "reserved",
    "site_local",
    "private",
)

SPECIAL_PURPOSE = tuple(
    ipaddress.ip_network(block)
    for block in (
        # IANA IPv4 Special-Purpose Address Registry (RFC 6890 and later)
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.0.2.0/24",
        "192.31.196.0/24",
        "192.52.193.0/24",
        "192.88.99.0/24",
        "192.168.0.0/16",
        "192.175.48.0/24",
        "198.18.0.0/15",
        "198.51.100.0/24",
        "203.0.113.0/24",
        "224.0.0.0/4",
        "240.0.0.0/4",
        # IANA IPv6 Special-Purpose Address Registry
        "::/128",
        "::1/128",
        "::ffff:0:0/96",
        "64:ff9b:1::/48",
        "100::/64",
        "2001::/23",
        "2001:db8::/32",
        "2620:4f:8000::/48",
        "3fff::/20",
        "5f00::/16",
        "fc00::/7",
        "fe80::/10",
        "fec0::/10",
        "ff00::/8",
    )
)
"""The blocks of IANA's special-purpose address registries (both families): none of them is a
webhook's. `2002::/16` (6to4) and `64:ff9b::/96` (NAT64) are judged by the IPv4 address they
embed."""

_EMBEDS_IPV4 = tuple(
    ipaddress.IPv6Network(block)
    for block in (
        "64:ff9b::/96",  # NAT64, well-known prefix (RFC 6052)
        "64:ff9b:1::/48",  # NAT64, local use (RFC 8215)
        "::ffff:0:0:0/96",  # IPv4-translated (RFC 2765)
        "::/96",  # IPv4-compatible (deprecated, RFC 4291)
    )
)
"""IPv6 blocks whose last 32 bits are an IPv4 address (besides IPv4-mapped, 6to4, Teredo)."""

_ROUTES_TO_IPV4 = (ipaddress.IPv6Network("2002::/16"), ipaddress.IPv6Network("64:ff9b::/96"))
"""6to4 and NAT64's well-known prefix: an address there reaches the IPv4 address it embeds,
and is allowed when that one is."""


def embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses that IPv6 address `ip` embeds: IPv4-mapped (`::ffff:a.b.c.d`), 6to4
    (`2002:AABB:CCDD::`), Teredo (its server and client), NAT64 (`64:ff9b::/96`,
    `64:ff9b:1::/48`), IPv4-translated and IPv4-compatible (the last 32 bits)."""
    found = [v4 for v4 in (ip.ipv4_mapped, ip.sixtofour) if v4 is not None]
    if ip.teredo is not None:
        found.extend(ip.teredo)
    if int(ip) > 1 and any(ip in block for block in _EMBEDS_IPV4):  # `::` and `::1` are not
        found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return found


def address_class(ip: IPAddress) -> str | None:
    """Why `ip` is not public (`loopback`, `link-local`, `private`, ..., `special-purpose`,
    `non-public`), or None when it is."""
    for category in _CATEGORIES:
        if getattr(ip, f"is_{category}", False):
            return category.replace("_", "-")
    if any(ip in block for block in SPECIAL_PURPOSE if block.version == ip.version):
        return "special-purpose"
    return None if ip.is_global else "non-public"


def refusal(address: str, port: int, settings: Settings) -> str | None:
    """Return why a webhook may not connect to `address` (an IP, text) on `port`, without
    naming the address (`its host resolves to a loopback address`), or None when it may.
    Always None with `settings.webhook_allow_private`."""
    if settings.webhook_allow_private:
        return None
    if port not in settings.webhook_ports:
        allowed = ", ".join(str(p) for p in sorted(settings.webhook_ports))
        return f"port {port} is not allowed (allowed: {allowed})"
    ip = ipaddress.ip_address(address.partition("%")[0])
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = embedded_ipv4(ip)
        for v4 in embedded:
            found = address_class(v4)
            if found is not None:
                return f"its host resolves to an IPv6 form of {_a(found)} address"
        if embedded and (ip.ipv4_mapped or any(ip in block for block in _ROUTES_TO_IPV4)):
            return None  # it reaches the public IPv4 address it embeds
    found = address_class(ip)
    return None if found is None else f"its host resolves to {_a(found)} address"


def _a(category: str) -> str:
    return f"an {category}" if category[0] in "aeiou" else f"a {category}"


async def resolve(host: str, port: int) -> list[str]:
    """Return the IP addresses (text) `host` resolves to for TCP, as the system resolver
    answers; an IP literal in its usual spelling resolves to itself without a lookup (the
    resolver's thread). Raises: `OSError` (`socket.gaierror`)."""
    with contextlib.suppress(ValueError):
        return [str(ipaddress.ip_address(host))]
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


async def checked_addresses(host: str, port: int, settings: Settings) -> list[str]:
    """Resolve `host`, within `webhook_connect_timeout`, and return its addresses when every
    one of them is allowed on `port`. Raises: `UnsafeWebhook` saying why the first refused
    one is (`its host resolves to a loopback address`: never naming it), or that `host` does
    not resolve, or not in time."""
    limit = settings.webhook_connect_timeout.total_seconds()
    try:
        async with asyncio.timeout(limit):
            addresses = await resolve(host.strip("[]"), port)
    except TimeoutError as exc:
        raise UnsafeWebhook(f"its host did not resolve within {limit:g} s") from exc
    except OSError as exc:
        raise UnsafeWebhook(f"its host does not resolve ({exc})") from exc
    if not addresses:
        raise UnsafeWebhook("its host does not resolve")
    for address in addresses:
        reason = refusal(address, port, settings)
        if reason is not None:
            raise UnsafeWebhook(reason)
    return addresses


async def check_url(url: str, settings: Settings) -> None:
    """Check a webhook URL at registration (see the module); nothing to check (no lookup)
    with `webhook_allow_private`. Raises: `UnsafeWebhook` (422)."""
    if settings.webhook_allow_private:
        return
    parsed = URL(url)
    if parsed.scheme not in ("http", "https") or not parsed.raw_host:
        raise UnsafeWebhook("webhook_url must be http or https")
    await checked_addresses(parsed.raw_host, parsed.port or 80, settings)


@dataclass(frozen=True, slots=True)
class Target:
    """Where one delivery attempt connects: the URL's `host` (as the HTTP client resolves it:
    IDNA-encoded, lower-case, no brackets), `port`, and the checked `addresses` it resolved to
    (the client tries them in turn); `address`, the first, is the one its shares count."""

    host: str
    port: int
    addresses: tuple[str, ...]

    @property
    def address(self) -> str:
        """The first address, which the delivery's shares count (`share_key`)."""
        return self.addresses[0]

    @property
    def share_key(self) -> str:
        """What the per-address delivery limits count by: the IPv4 address (an IPv4-mapped
        IPv6 address counts as its IPv4 one), or the /64 of an IPv6 one (one host's usual
        allocation: its addresses count as one)."""
        ip = ipaddress.ip_address(self.address.partition("%")[0])
        if isinstance(ip, ipaddress.IPv6Address):
            if ip.ipv4_mapped is not None:
                return str(ip.ipv4_mapped)
            return str(ipaddress.IPv6Network((int(ip) >> 64 << 64, 64)))
        return str(ip)


async def resolve_target(url: str, settings: Settings) -> Target:
    """Resolve the host of webhook `url` for one delivery attempt and check every address it
    resolves to (`checked_addresses`, even with `webhook_allow_private`, which allows every
    one); return them. Raises: `UnsafeWebhook`."""
    parsed = URL(url)
    host = (parsed.raw_host or "").strip("[]").lower()
    port = parsed.port or 80
    addresses = await checked_addresses(host, port, settings)
    return Target(host, port, tuple(addresses))


_PINNED: ContextVar[Target | None] = ContextVar("jobq_webhook_target", default=None)


@contextlib.contextmanager
def pinned(target: Target) -> Iterator[None]:
    """Within the block, a new connection of `webhook_client` to `target`'s host and port goes
    to `target.addresses` (checked again) instead of resolving the name once more (aiohttp
    resolves in the request's task, which sees this context)."""
    token = _PINNED.set(target)
    try:
        yield
    finally:
        _PINNED.reset(token)


class _GuardedResolver(AbstractResolver):
    """aiohttp's resolver for webhook connections: the pinned target's checked address
    (`pinned`), or every address of the name, checked (`checked_addresses`). aiohttp connects
    to what it returns, and verifies TLS against the name."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        target = _PINNED.get()
        if target is not None and (target.host, target.port) == (host.strip("[]").lower(), port):
            for address in target.addresses:
                reason = refusal(address, port, self._settings)
                if reason is not None:
                    raise UnsafeWebhook(reason)
            addresses = list(target.addresses)
        else:
            addresses = await checked_addresses(host, port, self._settings)
        return [
            ResolveResult(
                hostname=host,
                host=address,
                port=port,
                family=socket.AF_INET6 if ":" in address else socket.AF_INET,
                proto=0,
                flags=0,
            )
            for address in addresses
        ]

    async def close(self) -> None:
        return None


KEEPALIVE_S = 15.0
"""How long an idle webhook connection is kept for the next delivery to its host (aiohttp's
default): one per host and slot at most, since a worker's slots bound its deliveries."""


def webhook_timeout(settings: Settings) -> aiohttp.ClientTimeout:
    """The limits of one webhook call: `webhook_connect_timeout` to connect,
    `webhook_timeout` for each read (the longest wait for the next bytes). The whole attempt
    is bounded by `webhook_total_timeout` (`jobq.jobs.reminders.deliver`)."""
    return aiohttp.ClientTimeout(
        total=None,
        sock_connect=settings.webhook_connect_timeout.total_seconds(),
        sock_read=settings.webhook_timeout.total_seconds(),
    )


def webhook_client(
    settings: Settings, trace_configs: list[aiohttp.TraceConfig] | None = None
) -> aiohttp.ClientSession:
    """An `aiohttp.ClientSession` for webhook calls (call it on the running loop; close it,
    `async with`, when done): the guarded resolver (see the module), no cap on connections (a
    worker's slots and the delivery shares bound them), idle ones kept `KEEPALIVE_S`; no
    redirects are followed by the caller's requests (`allow_redirects=False`), no proxy from
    the environment (a proxy would connect on the guard's behalf), no cookies kept (one
    user's webhook could otherwise set them for another's), answers read raw (never
    decompressed); `webhook_timeout(settings)`; `trace_configs` (`jobq.tracing`)."""
    connector = aiohttp.TCPConnector(
        limit=0,
        keepalive_timeout=KEEPALIVE_S,
        resolver=_GuardedResolver(settings),
        use_dns_cache=False,
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=webhook_timeout(settings),
        cookie_jar=aiohttp.DummyCookieJar(),
        auto_decompress=False,
        trust_env=False,
        headers={"User-Agent": "jobq"},
        trace_configs=trace_configs,
    )


def warn_if_unguarded(settings: Settings) -> None:
    """Log a WARNING when the SSRF guard is off (`webhook_allow_private`): called at every
    start of a process that delivers."""
    if settings.webhook_allow_private:
        log.warning(
            "the webhook SSRF guard is off (JOBQ_WEBHOOK_ALLOW_PRIVATE=true): reminders may be"
            " delivered to any address and port, this machine's and its network's included;"
            " for local development only"
        )
