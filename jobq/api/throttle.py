"""Rate limits: token buckets per API key (`jobq.api.auth`) and, for callers without a key,
per client address.

Two throttles hold per client address (an IPv6 address counts by its /64, which one host
usually owns whole):

- **sign-ups**: `POST /users` (open sign-up) may be sent `SIGNUP_BURST` times at once and
  `JOBQ_SIGNUP_RATE_PER_HOUR` times an hour on average;
- **failed credentials**: a wrong or malformed API key, a wrong admin token (API, `/metrics`,
  the dashboard's bearer requests and login form) each take a token of a bucket of
  `FAILURE_BURST`, refilled at `JOBQ_AUTH_FAILURES_PER_MIN` a minute. While it is empty, every
  request from that address that carries a credential is refused before the credential is
  checked, right ones included: a guesser learns nothing more until it refills. Guesses sent
  all at once may pass the check together (an API key is checked in the database, after an
  await); each still costs its token, the bucket going into debt, so over time an address
  gets no more than the rate.

Beyond either: 429 `too_many_requests` with `Retry-After` (whole seconds). The buckets live in
the process (like the API keys'): with N web processes an address gets up to N times the rate,
and a restart forgets them. The address is the TCP peer's (`request.remote_addr`): behind a
reverse proxy every client has the proxy's, unless the server is told to read the forwarded
one (hypercorn's `ProxyFixMiddleware`, which trusts the proxy's header).
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass

from quart import current_app, request

from jobq.config import Settings
from jobq.errors import TooManyRequests

SIGNUP_BURST = 5
"""Sign-ups one client address may make at once."""

FAILURE_BURST = 10
"""Failed credentials one client address may send at once."""


@dataclass
class _Bucket:
    tokens: float
    updated: float


class RateLimiter:
    """Token buckets per key: `burst` tokens, refilled at `per_s` a second (monotonic clock).
    Keeps the `max_keys` most recently used buckets (a forgotten bucket is full). `per_s` 0:
    no limit."""

    def __init__(self, per_s: float, burst: int, max_keys: int = 100_000) -> None:
        self.per_s = per_s
        self.burst = burst
        self.max_keys = max_keys
        self._buckets: OrderedDict[Hashable, _Bucket] = OrderedDict()

    def _refilled(self, key: Hashable, now: float) -> _Bucket:
        bucket = self._buckets.pop(key, None) or _Bucket(float(self.burst), now)
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.updated) * self.per_s)
        bucket.updated = now
        self._buckets[key] = bucket
        if len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
        return bucket

    def wait(self, key: Hashable, now: float | None = None) -> float:
        """The seconds until `key` has a token (0: it has one now); takes none."""
        if self.per_s <= 0:
            return 0.0
        bucket = self._refilled(key, time.monotonic() if now is None else now)
        return 0.0 if bucket.tokens >= 1 else (1 - bucket.tokens) / self.per_s

    def charge(self, key: Hashable, now: float | None = None) -> None:
        """Take one token for `key` even when it has none: its bucket goes into debt, which
        the refill pays back before `key` may go on (so requests that all passed `wait` at
        once, before any was charged, still cost their sender their full time)."""
        if self.per_s > 0:
            self._refilled(key, time.monotonic() if now is None else now).tokens -= 1

    def take(self, key: Hashable, now: float | None = None) -> float:
        """Take one token for `key`: return 0 when allowed, else the seconds until a token is
        there (none is taken then)."""
        if self.per_s <= 0:
            return 0.0
        bucket = self._refilled(key, time.monotonic() if now is None else now)
        if bucket.tokens >= 1:
            bucket.tokens -= 1
            return 0.0
        return (1 - bucket.tokens) / self.per_s


@dataclass(frozen=True)
class Throttles:
    """The app's throttles of client addresses (`jobq.app` keeps one in its extensions)."""

    signups: RateLimiter
    failures: RateLimiter

    @classmethod
    def of(cls, settings: Settings) -> Throttles:
        """From `signup_rate_per_hour` and `auth_failures_per_min`."""
        return cls(
            signups=RateLimiter(settings.signup_rate_per_hour / 3600, SIGNUP_BURST),
            failures=RateLimiter(settings.auth_failures_per_min / 60, FAILURE_BURST),
        )


def client_key(address: str | None) -> str:
    """The bucket of a client address: an IPv4 address itself, an IPv6 address its /64 (an
    IPv4-mapped one its IPv4 address); anything else (a Unix socket) as given."""
    try:
        ip = ipaddress.ip_address(address or "")
    except ValueError:
        return address or "-"
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def _throttles() -> Throttles:
    found: Throttles = current_app.extensions["jobq.throttles"]
    return found


def _refuse(wait_s: float, message: str) -> TooManyRequests:
    return TooManyRequests(message, retry_after_s=max(1, math.ceil(wait_s)))


def take_signup() -> None:
    """Count a sign-up of this request's client. Raises: `TooManyRequests` beyond its rate."""
    wait_s = _throttles().signups.take(client_key(request.remote_addr))
    if wait_s > 0:
        raise _refuse(wait_s, "too many sign-ups from this address")


def failures_retry_after() -> int:
    """The whole seconds until this request's client may present a credential again (0:
    now)."""
    wait_s = _throttles().failures.wait(client_key(request.remote_addr))
    return max(1, math.ceil(wait_s)) if wait_s > 0 else 0


def check_failures() -> None:
    """Call before checking a credential. Raises: `TooManyRequests` while this request's
    client has used up its failed attempts."""
    retry_after_s = failures_retry_after()
    if retry_after_s:
        raise TooManyRequests(
            "too many failed attempts from this address", retry_after_s=retry_after_s
        )


def record_failure() -> None:
    """Count a failed credential of this request's client (into debt: see
    `RateLimiter.charge`)."""
    _throttles().failures.charge(client_key(request.remote_addr))
