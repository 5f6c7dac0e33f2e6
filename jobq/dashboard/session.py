"""Who may use the dashboard, and the CSRF protection of its actions.

Every page and action needs the admin token (`JOBQ_ADMIN_TOKEN`); with none configured they
answer 404, like the admin endpoints. Two ways to give it:

- the login form: the token is checked (constant time) and a session cookie is set,
  `jobq_dashboard=<issued>.<nonce>.<signature>` with `HttpOnly; Secure; SameSite=Strict;
  Path=/dashboard`. The signature is HMAC-SHA256 under the admin token (so the cookie holds no
  secret, and changing the token ends every session); a session lasts `SESSION_MAX_AGE`. The
  session also lives on the server (`dashboard_session`, keyed by SHA-256 of the nonce): the
  logout deletes it there, so the old cookie and its CSRF token are refused from then on,
  by every web process.
- `Authorization: Bearer <token>` on each request (scripts, the benchmark).

A state-changing action (a POST) with the cookie must carry the session's CSRF token in the
form field `csrf` (HMAC-SHA256 of the session under the admin token: the synchronizer token
pattern, OWASP's CSRF cheat sheet, without server-side state), and must not come from another
origin (`Origin`, `Sec-Fetch-Site`); else 403 `csrf_failed` and nothing changes. A bearer
request needs no CSRF token: a browser never adds that header by itself. Neither the token nor
a session value is ever logged or rendered.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import logging
import secrets
from collections.abc import Awaitable, Callable, Coroutine
from datetime import timedelta
from typing import Any, ParamSpec, TypeVar
from urllib.parse import urlsplit

from quart import Response, current_app, g, request, url_for
from werkzeug.exceptions import NotFound

from jobq import clock, db, statements
from jobq.api.admin import Refused, authorize_request
from jobq.config import Settings
from jobq.errors import CrossSiteRefused

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

COOKIE = "jobq_dashboard"
SESSION_MAX_AGE = timedelta(hours=12)
"""How long a login lasts."""


def see_other(location: str) -> Response:
    """A 303 to `location` (after a form, and to the login form)."""
    return Response("", status=303, headers={"Location": location})


def _settings() -> Settings:
    settings: Settings = current_app.extensions["jobq.settings"]
    return settings


def _key(settings: Settings) -> bytes:
    if settings.admin_token is None:
        raise NotFound()
    return settings.admin_token.get_secret_value().encode()


def require_token(settings: Settings) -> None:
    """Raise `NotFound` (404) when no admin token is configured: the dashboard is off."""
    _key(settings)


def _sign(settings: Settings, purpose: str, value: str) -> str:
    return hmac.new(_key(settings), f"{purpose}:{value}".encode(), hashlib.sha256).hexdigest()


def token_matches(settings: Settings, given: str) -> bool:
    """Whether `given` is the admin token (constant time). Raises: `NotFound` with none set."""
    return hmac.compare_digest(given.strip().encode(), _key(settings))


def _session_id(value: str) -> bytes:
    """The server-side id of cookie `value`: SHA-256 of its nonce."""
    return hashlib.sha256(value.split(".")[1].encode()).digest()


async def new_session(settings: Settings) -> str:
    """Start a session (stored server-side until its logout or expiry); return its cookie's
    value: `<issued unix s>.<random nonce>.<HMAC of both>`."""
    now = clock.now()
    issued = f"{int(now.timestamp())}.{secrets.token_urlsafe(16)}"
    value = f"{issued}.{_sign(settings, 'session', issued)}"
    async with db.transaction() as conn:
        await statements.dashboard_session_create.execute(
            conn, id=_session_id(value), now=now, expires_at=now + SESSION_MAX_AGE
        )
    return value


def _signed(settings: Settings, value: str | None) -> bool:
    """Whether cookie `value` is a session signed under the admin token and not expired."""
    if not value or value.count(".") != 2:
        return False
    issued, _, signature = value.rpartition(".")
    if not hmac.compare_digest(signature.encode(), _sign(settings, "session", issued).encode()):
        return False
    stamp = issued.partition(".")[0]
    if not stamp.isascii() or not stamp.isdigit():
        return False
    age = clock.now().timestamp() - int(stamp)
    return 0 <= age <= SESSION_MAX_AGE.total_seconds()


async def session_valid(settings: Settings, value: str | None) -> bool:
    """Whether cookie `value` is a live session: signed under the admin token, not expired,
    and not ended by a logout (one primary-key lookup)."""
    if value is None or not _signed(settings, value):
        return False
    async with db.transaction(readonly=True) as conn:
        live: bool = await statements.dashboard_session_live.fetchval(
            conn, id=_session_id(value), now=clock.now()
        )
    return live


async def end_session(value: str | None) -> None:
    """End the session of cookie `value` on the server (nothing for a malformed value)."""
    if value is None or value.count(".") != 2:
        return
    async with db.transaction() as conn:
        await statements.dashboard_session_end.execute(conn, id=_session_id(value))


def csrf_token(settings: Settings, session: str) -> str:
    """The CSRF token of `session`: HMAC-SHA256 of it under the admin token (hex)."""
    return _sign(settings, "csrf", session)


def set_session(response: Response, value: str | None) -> Response:
    """Set (or, with None, delete) the session cookie on `response`."""
    if value is None:
        response.delete_cookie(COOKIE, path="/dashboard", secure=True, httponly=True)
    else:
        response.set_cookie(
            COOKIE,
            value,
            max_age=int(SESSION_MAX_AGE.total_seconds()),
            path="/dashboard",
            secure=True,
            httponly=True,
            samesite="Strict",
        )
    return response


def _same_origin() -> bool:
    """Whether the request's `Origin` (when sent) is this site, and `Sec-Fetch-Site` (when
    sent) says the same."""
    if request.headers.get("Sec-Fetch-Site", "same-origin") not in ("same-origin", "none"):
        return False
    origin = request.headers.get("Origin")
    if origin is None:
        return True
    return urlsplit(origin).netloc == request.host and origin != "null"


def login_only(
    fn: Callable[P, Awaitable[T]],
) -> Callable[P, Coroutine[Any, Any, T | Response]]:
    """Require the admin token (bearer) or a valid session before `fn` runs. Without either,
    a browser's GET is sent to the login form; anything else gets 401 (JSON). A POST with a
    session must carry its CSRF token and come from this site (see the module), else 403.
    Sets `g.dashboard_csrf` (the token the pages' forms carry; empty for a bearer request)."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T | Response:
        settings = _settings()
        require_token(settings)
        if "Authorization" in request.headers:
            authorize_request(settings, "dashboard request")
            g.dashboard_csrf = ""
            return await fn(*args, **kwargs)
        session = request.cookies.get(COOKIE)
        if not await session_valid(settings, session):
            if request.method == "GET":
                return see_other(url_for("dashboard.login", next=request.full_path))
            log.warning("dashboard request refused (no session): %s", request.path)
            raise Refused("no session", None)
        assert session is not None
        g.dashboard_csrf = csrf_token(settings, session)
        if request.method == "POST":
            form = await request.form
            given = form.get("csrf", "")
            if not _same_origin() or not hmac.compare_digest(
                given.encode(), g.dashboard_csrf.encode()
            ):
                log.warning("dashboard action refused (cross-site): %s", request.path)
                raise CrossSiteRefused(path=request.path)
        return await fn(*args, **kwargs)

    return wrapper


def check_login_origin() -> None:
    """Refuse (403) a login form posted from another site."""
    if not _same_origin():
        raise CrossSiteRefused(path=request.path)
