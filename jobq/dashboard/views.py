"""The dashboard's pages and actions (see `jobq.dashboard`).

Pages (GET): `/dashboard` (queues, workers, schedules, the database's health), `/dashboard/jobs`
(the job search), `/dashboard/jobs/<id>` (a job: attempts, errors, result), `/dashboard/dead`
(the dead letter). Actions (POST, then a 303 back to the page): pause and resume a queue, retry
and discard dead jobs (one, or those ticked), retry a failed job, cancel a job, log out.
Each page renders whole; `dashboard.js` fetches it again every few seconds and swaps its
`data-live` parts, so the pages work without the script, only without the live refresh.
"""

from __future__ import annotations

import functools
import time
from collections import deque
from typing import Any

import asyncpg
from pydantic import ValidationError
from quart import Blueprint, Response, current_app, g, render_template, request, url_for
from quart_schema import hide

from jobq import clock, db, statements
from jobq.api import throttle
from jobq.api.admin import JobsQuery
from jobq.api.audit import audit
from jobq.config import Settings
from jobq.dashboard import format, session
from jobq.dashboard.format import FILTERS
from jobq.domain.types import parse_id
from jobq.errors import Conflict, NotFound
from jobq.queue import control, dead, metrics, schedule, store
from jobq.queue.control import JobState

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

RATE_EVENTS = ("enqueued", "succeeded", "failed")
"""The events whose rates (jobs/s) the queues table shows (from `job_counter`)."""

RATE_WINDOW_S = 60.0
"""Rates are averaged over the readings of the last minute (at least `MIN_RATE_SPAN_S`)."""
MIN_RATE_SPAN_S = 1.0

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


async def _page(template: str, status: int = 200, **context: Any) -> Response:
    now = clock.now()
    html = await render_template(
        f"dashboard/{template}",
        now=now,
        when=functools.partial(format.when, now=now),
        csrf=g.get("dashboard_csrf", ""),
        refresh_s=REFRESH_S,
        max_depth=MAX_DEPTH,
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


Counts = dict[str, dict[str, int]]
"""Cumulative event counts: `{queue: {event: count}}` (`metrics.event_counts`)."""


def rates(
    readings: deque[tuple[float, Counts]], now_s: float, counts: Counts
) -> dict[str, dict[str, float]]:
    """Jobs/s per queue and event (`RATE_EVENTS`): the change of the cumulative `counts` since
    the oldest of `readings` (monotonic seconds, counts) within `RATE_WINDOW_S` of `now_s`,
    over that interval; empty until that interval is `MIN_RATE_SPAN_S` long. `readings` is
    updated: older ones dropped, this one kept when `MIN_RATE_SPAN_S` after the last."""
    while readings and now_s - readings[0][0] > RATE_WINDOW_S:
        readings.popleft()
    if not readings or now_s - readings[-1][0] >= MIN_RATE_SPAN_S:
        readings.append((now_s, counts))
    then, old = readings[0]
    if now_s - then < MIN_RATE_SPAN_S:
        return {}
    return {
        queue: {
            event: max(0, events.get(event, 0) - old.get(queue, {}).get(event, 0)) / (now_s - then)
            for event in RATE_EVENTS
        }
        for queue, events in counts.items()
    }


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
    """Queues (depth, rates, running, limits; pause and resume), workers, schedules with their
    next occurrences, and the database's health."""
    settings = _settings()
    now = clock.now()
    async with db.transaction(readonly=True) as conn:
        queues = await store.list_queues(conn, now=now, max_count=MAX_DEPTH + 1)
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
        rates=rates(_readings(), time.monotonic(), counts),
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
    """Pause or resume queue `name` for every worker (`store.pause_queue`). 404: no queue."""
    async with db.transaction() as conn:
        if not await store.pause_queue(conn, name, paused=verb == "pause"):
            raise NotFound("no such queue", queue=name)
    audit(f"queue.{verb}", f"queue:{name}")
    return _back("dashboard.overview", done=f"{name}: {verb}d", _anchor="queues")


# -- jobs -------------------------------------------------------------------------------------


SEARCH_TIMEOUT_MS = 3000
"""The longest a job search may take: a search for a type or queue that only a few of millions
of finished jobs have walks `job_done` by id, and is cut off then, saying so."""


async def _search_page(
    status: int,
    error: str | None,
    query: dict[str, str],
    found: list[control.JobView] = [],  # noqa: B006 (never mutated)
    next_after: int | None = None,
) -> Response:
    return await _page(
        "jobs.html",
        status=status,
        error=error,
        query=query,
        jobs=found,
        next_after=next_after,
        states=list(JobState),
    )


@bp.get("/jobs")
@hide
@session.login_only
async def jobs() -> Response:
    """The job search: by id (straight to the job), or by queue, type and state, newest first,
    `PAGE_SIZE` at a time (`after`: the last id of the page before). 400 for a malformed
    search; 503 when it takes longer than `SEARCH_TIMEOUT_MS` (it is cancelled)."""
    args = {k: v.strip() for k, v in request.args.items() if v.strip()}
    given = args.pop("id", None)
    if given is not None:
        job_id = parse_id(given)
        if job_id is None:
            return await _search_page(400, "An id is a whole number.", {})
        return _back("dashboard.job", job_id=job_id)
    try:
        query = JobsQuery.model_validate({**args, "limit": PAGE_SIZE})
    except ValidationError as exc:
        fields = ", ".join(str(e["loc"][0]) for e in exc.errors())
        return await _search_page(400, f"Not a valid search ({fields}).", args)
    try:
        async with db.transaction(readonly=True) as conn:
            await statements.setting_local.execute(
                conn, setting="statement_timeout", value=str(SEARCH_TIMEOUT_MS)
            )
            found = await control.list_jobs(
                conn,
                now=clock.now(),
                limit=PAGE_SIZE,
                after=query.after,
                queue=query.queue,
                job_type=query.job_type,
                state=query.state,
            )
    except asyncpg.QueryCanceledError:
        error = (
            f"The search took longer than {SEARCH_TIMEOUT_MS / 1000:g} s and was stopped:"
            " few jobs match among many. Narrow it with a state."
        )
        return await _search_page(503, error, args)
    next_after = found[-1].id if len(found) == PAGE_SIZE else None
    return await _search_page(200, None, args, found, next_after)


@bp.get("/jobs/<int:job_id>")
@hide
@session.login_only
async def job(job_id: int) -> Response:
    """One job wherever it is: its state, arguments, attempts with their errors, its result."""
    async with db.transaction(readonly=True) as conn:
        found = await control.find(conn, job_id, now=clock.now())
    if found is None:
        return await _page("job.html", status=404, job=None, job_id=job_id, done=None)
    return await _page("job.html", job=found, job_id=job_id, done=request.args.get("done"))


@bp.post("/jobs/<int:job_id>/<any(retry, cancel):verb>")
@hide
@session.login_only
async def job_action(job_id: int, verb: str) -> Response:
    """Retry a failed job (back to the queue, attempts 0), or cancel a job; when its state
    does not allow it, the page says why."""
    now = clock.now()
    try:
        async with db.transaction() as conn:
            if verb == "retry":
                await dead.retry(conn, job_id, now=now)
            else:
                await control.cancel(conn, job_id, now=now, retain=_settings().retain)
    except (Conflict, NotFound) as exc:
        return _back("dashboard.job", job_id=job_id, done=f"not done: {exc.message}")
    audit("dead_job.retry" if verb == "retry" else "job.cancel", f"job:{job_id}")
    return _back("dashboard.job", job_id=job_id, done="retried" if verb == "retry" else "cancelled")


# -- the dead letter --------------------------------------------------------------------------


@bp.get("/dead")
@hide
@session.login_only
async def dead_letter() -> Response:
    """The dead letter, newest first, `PAGE_SIZE` at a time, each job with retry and discard,
    and the ticked ones in bulk."""
    after_id = parse_id(request.args.get("after", ""))
    async with db.transaction(readonly=True) as conn:
        rows = await dead.list_dead(conn, limit=PAGE_SIZE, after=after_id)
    return await _page(
        "dead.html",
        jobs=rows,
        next_after=rows[-1]["id"] if len(rows) == PAGE_SIZE else None,
        done=request.args.get("done"),
    )


@bp.post("/dead")
@hide
@session.login_only
async def dead_action() -> Response:
    """Retry or discard dead jobs: one (`retry=<id>` or `discard=<id>`), or those ticked
    (`action=retry|discard`, `id=<id>` each). Each job in its own transaction; one whose twin
    is queued (retry) or that is gone already is counted apart."""
    form = await request.form
    if "retry" in form or "discard" in form:
        verb = "retry" if "retry" in form else "discard"
        ids = [form[verb]]
    else:
        verb = form.get("action", "")
        ids = form.getlist("id")
    job_ids = {parse_id(i) for i in ids}
    if verb not in ("retry", "discard") or not ids or None in job_ids:
        raise Conflict("tick at least one dead job, then press retry or discard")
    done, skipped = 0, 0
    for job_id in sorted(i for i in job_ids if i is not None):
        try:
            async with db.transaction() as conn:
                if verb == "retry":
                    await dead.retry(conn, job_id, now=clock.now())
                else:
                    await dead.discard(conn, job_id)
            audit(f"dead_job.{verb}", f"job:{job_id}")
            done += 1
        except (Conflict, NotFound):
            skipped += 1
    message = f"{verb}: {done} job{'s' * (done != 1)}"
    if skipped:
        message += f"; {skipped} left (an identical job is queued, or gone already)"
    return _back("dashboard.dead_letter", done=message)
