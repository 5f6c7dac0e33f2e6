"""Who is calling: a user's API key on the user-scoped routes, and its rate limit.

`user_only` requires `Authorization: Bearer <api key>` (see `jobq.domain.keys`). A missing,
malformed, unknown or revoked key gets 401 `unauthorized` with `WWW-Authenticate: Bearer`;
the key is never logged or echoed. A key's lookup is cached for a second per process
(`jobq.domain.keys.KeyCache`): a key revoked through another process is refused within a
second, through this one at once. A route with `<user_id>` in its path answers 404 for
another user's id, and the domain answers 404 for another user's reminder or export: a caller
cannot tell another user's resources from missing ones.

Each key may make `rate_limit_burst` requests at once and `rate_limit_per_s` on average (a
token bucket per key, kept in this process: with N web processes a key gets up to N times the
rate); beyond that, 429 `too_many_requests` with `Retry-After` (whole seconds). Wrong keys count
against their sender's address (`jobq.api.throttle`): past its allowance, 429 before any key
is checked.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from quart import current_app, g, request
from quart_schema import security_scheme
from werkzeug.datastructures import WWWAuthenticate
from werkzeug.exceptions import Unauthorized

from jobq.api import throttle
from jobq.api.throttle import RateLimiter
from jobq.config import Settings
from jobq.domain import keys
from jobq.errors import NotFound, TooManyRequests

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

SECURITY_SCHEME = "api_key"
"""The OpenAPI security scheme (HTTP bearer) of the user-scoped routes; `jobq.app` declares
it."""


class KeyRefused(Unauthorized):
    """401: the API key is missing or wrong. `reason` says which, for the log."""

    def __init__(self, reason: str) -> None:
        challenge = WWWAuthenticate("bearer", {"realm": "jobq"})
        if reason != "no key":
            challenge["error"] = "invalid_token"  # RFC 6750, 3.1
        super().__init__("send Authorization: Bearer <api_key>", www_authenticate=challenge)
        self.reason = reason


def bearer(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def current_user_id() -> int:
    """The id of the user whose key authorised this request (set by `user_only`)."""
    user_id: int = g.jobq_user_id
    return user_id


def current_key_id() -> int:
    """The id of the key that authorised this request (set by `user_only`)."""
    key_id: int = g.jobq_key_id
    return key_id


def user_only(
    fn: Callable[P, Awaitable[T]],
) -> Callable[P, Coroutine[Any, Any, T]]:
    """Require a user's API key (see the module), then its rate limit, before `fn` runs; a
    `user_id` path argument must be the key's user (404 otherwise). Put it right under the
    route decorator, above the validation decorators, so that a stranger learns nothing from
    validation."""

    @security_scheme([{SECURITY_SCHEME: []}])
    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        token = bearer(request.headers.get("Authorization"))
        if token is not None:
            throttle.check_failures()
        cache: keys.KeyCache = current_app.extensions["jobq.key_cache"]
        found = None if token is None else await keys.authenticate(token, cache)
        if found is None:
            reason = "no key" if token is None else "wrong key"
            log.info("request refused (%s): %s %s", reason, request.method, request.path)
            if token is not None:
                throttle.record_failure()
            raise KeyRefused(reason)
        user_id, key_id = found
        g.jobq_user_id, g.jobq_key_id = user_id, key_id
        limiter: RateLimiter = current_app.extensions["jobq.rate_limiter"]
        wait_s = limiter.take(key_id)
        if wait_s > 0:
            raise TooManyRequests(retry_after_s=max(1, math.ceil(wait_s)))
        if "user_id" in kwargs and kwargs["user_id"] != user_id:
            raise NotFound("no such user", user_id=kwargs["user_id"])  # as for an unknown id
        return await fn(*args, **kwargs)

    return wrapper


def rate_limiter(settings: Settings) -> RateLimiter:
    """The app's rate limiter, from `rate_limit_per_s` and `rate_limit_burst`."""
    return RateLimiter(settings.rate_limit_per_s, settings.rate_limit_burst)


def key_cache() -> keys.KeyCache:
    """The app's cache of API key lookups (`jobq.domain.keys.KeyCache`)."""
    return keys.KeyCache()
