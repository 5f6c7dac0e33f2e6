"""The dashboard's frame and overview (see `jobq.dashboard`; the job lists are
`jobq.dashboard.lists`).

Pages (GET): `/dashboard` (queues, their charts, workers, schedules, the database's health),
`/dashboard/history` (the charts' data, JSON), the login form. Actions (POST, then a 303 back
to the page): pause and resume a queue, log in, log out.
Each page renders whole; `dashboard.js` fetches it again every few seconds and swaps its
`data-live` parts, so the pages work without the script, only without the live refresh.
"""

from __future__ import annotations

import functools
import json
import time
from collections import deque
from typing import Any

from quart import Blueprint, Response, current_app, g, render_template, request, url_for
from quart_schema import hide

from jobq import clock, db
from jobq.api import throttle
from jobq.api.audit import audit
from jobq.config import Settings
from jobq.dashboard import format, session
from jobq.dashboard.format import FILTERS
from jobq.errors import NotFound
from jobq.queue import dead, history, limits, metrics, schedule
from jobq.queue.history import Counts, rates
from jobq.queue.limits import queue_holds

bp = Blueprint(
    "dashboard",
    __name__,
    url_prefix="/dashboard",
    template_folder="templates",
    static_folder="static",
    static_url_path="/static",
)

PAGE_SIZE = 50
"""Rows of a job list or of the dead letter per page."""

NEXT_OCCURRENCES = 3
"""Occurrences shown per schedule declared in code (a reminder's schedule shows its next)."""

MAX_DEPTH = metrics.LIVE_COUNT_MAX
"""The overview counts a queue's ripe and scheduled jobs up to this many (then says "more
than"): counting a million queued jobs takes a quarter of a second, every refresh."""

REFRESH_S = 5
"""How often the script refreshes a page."""

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


hide(Blueprint.send_static_file)  # its static files are no API (as quart-schema does for the app's)


@bp.record_once
def _setup(state: Any) -> None:
    state.app.jinja_env.filters.update(FILTERS)


@bp.after_request
async def _headers(response: Response) -> Response:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response


def _settings() -> Settings:
    settings: Settings = current_app.extensions["jobq.settings"]
    return settings


MAX_DEAD_SHOWN = 9_999
"""The menu counts the dead letter up to this many (then says "9,999+")."""


async def _page(template: str, status: int = 200, **context: Any) -> Response:
    now = clock.now()
    dead_count = None
    if "dashboard_csrf" in g:  # logged in: the menu shows the dead letter's size
        async with db.transaction(readonly=True) as conn:
            dead_count = await dead.count(conn, max_count=MAX_DEAD_SHOWN)
    html = await render_template(
        f"dashboard/{template}",
        now=now,
        when=functools.partial(format.when, now=now),
        csrf=g.get("dashboard_csrf", ""),
        refresh_s=REFRESH_S,
        max_depth=MAX_DEPTH,
        dead_count=dead_count,
        max_dead_shown=MAX_DEAD_SHOWN,
        **context,
    )
    return Response(html, status=status, content_type="text/html; charset=utf-8")


def _back(endpoint: str, **values: Any) -> Response:
    """A 303 to a page (after an action)."""
    return session.see_other(url_for(endpoint, **values))


# -- logging in and out ------------------------------------------------------------------------


def _safe_next(target: str | None) -> str:
    """Where to go after the login: a dashboard path only (never another site)."""
    if target and target.startswith("/dashboard") and "//" not in target and "\\" not in target:
        return target
    return url_for("dashboard.overview")


@bp.get("/login")
@hide
async def login() -> Response:
    """The login form (404 without an admin token)."""
    session.require_token(_settings())
    return await _page("login.html", next=_safe_next(request.args.get("next")), error=None)


@bp.post("/login")
@hide
async def login_post() -> Response:
    """Check the admin token from the form; set the session cookie and go on, or 401 with the
    form again."""
    settings = _settings()
    session.require_token(settings)
    session.check_login_origin()
    form = await request.form
    target = _safe_next(form.get("next"))
    retry = throttle.failures_retry_after()
    if retry:
        error = f"Too many wrong tokens from your address: try again in {retry} s."
        page = await _page("login.html", status=429, next=target, error=error)
        page.headers["Retry-After"] = str(retry)
        return page
    if not session.token_matches(settings, form.get("token", "")):
        session.log.warning("dashboard login refused (wrong token) from %s", request.remote_addr)
        throttle.record_failure()
        return await _page("login.html", status=401, next=target, error="That is not the token.")
    return session.set_session(session.see_other(target), await session.new_session(settings))


@bp.post("/logout")
@hide
@session.login_only
async def logout() -> Response:
    """End the session, on the server (its cookie and CSRF token are refused from now on) and
    in the browser (the cookie is deleted)."""
    await session.end_session(request.cookies.get(session.COOKIE))
    return session.set_session(_back("dashboard.login"), None)


# -- the overview: queues, workers, schedules, database ------------------------------------------


def _readings() -> deque[tuple[float, Counts]]:
    """This process's recent readings of the counts (the rates' memory)."""
    found: deque[tuple[float, Counts]] = current_app.extensions.setdefault(
        "jobq.dashboard.readings", deque()
    )
    return found


@bp.get("/")
@hide
@session.login_only
async def overview() -> Response:
    """Queues (depth, held back and why, rates, running, limits; pause and resume), their
    charts (drawn by `charts.js` from `/dashboard/history`), workers, schedules with their next
    occurrences, and the database's health."""
    settings = _settings()
    now = clock.now()
    async with db.transaction(readonly=True) as conn:
        queues = await limits.list_queues(conn, now=now, max_count=MAX_DEPTH + 1)
        holds = await queue_holds(conn, now=now)
        counts = await metrics.event_counts(conn)
        workers = await dead.list_workers(conn, now=now, heartbeat_grace=settings.heartbeat_grace)
        schedules = await schedule.read_schedules(conn)
        vacuum = await metrics.vacuum_stats(conn, now=now)
        tables = await metrics.table_stats(conn)
    for s in schedules:  # a reminder's: its stored next one (a page shows thousands, each 5 s)
        s["occurrences"] = schedule.next_occurrences(
            s, NEXT_OCCURRENCES if s["source"] == "code" else 1
        )
    return await _page(
        "overview.html",
        queues=queues,
        holds=holds,
        rates=rates(_readings(), time.monotonic(), counts),
        windows=list(history.WINDOWS),
        workers=workers,
        schedules=schedules,
        oldest_transaction_s=vacuum["oldest_transaction_s"],
        tables=tables,
        done=request.args.get("done"),
    )


@bp.post("/queues/<queue:name>/<any(pause, resume):verb>")
@hide
@session.login_only
async def pause_queue(name: str, verb: str) -> Response:
    """Pause or resume queue `name` for every worker (`limits.pause_queue`). 404: no queue."""
    async with db.transaction() as conn:
        if not await limits.pause_queue(conn, name, paused=verb == "pause"):
            raise NotFound("no such queue", queue=name)
    audit(f"queue.{verb}", f"queue:{name}")
    return _back("dashboard.overview", done=f"{name}: {verb}d", _anchor="queues")


@bp.get("/history")
@hide
@session.login_only
async def history_data() -> Response:
    """The charts' data, JSON (`history.series`): `?window=1h` (default) or `24h`. 400 for
    another window."""
    window = request.args.get("window", "1h")
    if window not in history.WINDOWS:
        return Response('{"error": "window is 1h or 24h"}', 400, content_type="application/json")
    async with db.transaction(readonly=True) as conn:
        data = await history.series(conn, now=clock.now(), window=window)
    return Response(json.dumps(data), content_type="application/json")
