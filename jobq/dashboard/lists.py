"""The dashboard's job lists and their actions (see `jobq.dashboard`).

Pages (GET): `/dashboard/jobs` (the job search: by id, queue, type, state and arguments; jobs
held back say why), `/dashboard/jobs/<id>` (a job: attempts, errors, result),
`/dashboard/dead` (the dead letter, filtered). Actions (POST, then a 303 back to the page):
retry a failed job, cancel a job, cancel the ticked ones; retry and discard dead jobs (one,
those ticked, or every one the filter matches, not only the page shown).
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Any

import asyncpg
from pydantic import ValidationError
from quart import Response, request
from quart_schema import hide

from jobq import clock, db, statements
from jobq.api.admin import JobsQuery
from jobq.api.audit import audit
from jobq.dashboard import session
from jobq.dashboard.views import PAGE_SIZE, _back, _page, _settings, bp
from jobq.db import Connection
from jobq.domain.types import parse_id
from jobq.errors import Conflict, NotFound
from jobq.queue import control, dead
from jobq.queue.control import JobState
from jobq.queue.dead import DeadFilter
from jobq.queue.limits import held_reasons

SEARCH_TIMEOUT_MS = 3000
"""The longest a job search may take: a search for a type, a queue or arguments that only a
few of millions of finished jobs have walks `job_done` by id, and is cut off then, saying so."""

MAX_ARGUMENTS_CHARS = 2000
"""The longest arguments filter (a JSON object)."""

BULK_BATCH = 200
"""Dead jobs read per batch by a bulk retry or discard of a filter."""

BULK_BUDGET_S = 20.0
"""The longest a bulk action works in one request; then it says how far it got (press again)."""


def _arguments(text: str | None) -> dict[str, Any] | None:
    """The arguments filter: a JSON object (None when empty). Raises: `ValueError`."""
    if not text:
        return None
    if len(text) > MAX_ARGUMENTS_CHARS:
        raise ValueError(f"arguments: at most {MAX_ARGUMENTS_CHARS} characters")
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise ValueError('arguments: a JSON object, such as {"user_id": 7}') from None
    if not isinstance(value, dict):
        raise ValueError('arguments: a JSON object, such as {"user_id": 7}')
    return value


async def _held(conn: Connection, jobs: list[control.JobView], now: datetime) -> dict[int, Any]:
    """Why each queued, ripe job of `jobs` is held back (`limits.held_reasons`), by id."""
    return await held_reasons(conn, [j.id for j in jobs if j.state is JobState.QUEUED], now=now)


# -- jobs -------------------------------------------------------------------------------------


async def _search_page(
    status: int,
    error: str | None,
    query: dict[str, str],
    found: list[control.JobView] = [],  # noqa: B006 (never mutated)
    next_after: int | None = None,
    held: dict[int, Any] | None = None,
) -> Response:
    return await _page(
        "jobs.html",
        status=status,
        error=error,
        query=query,
        jobs=found,
        held=held or {},
        next_after=next_after,
        states=list(JobState),
        done=request.args.get("done"),
    )


@bp.get("/jobs")
@hide
@session.login_only
async def jobs() -> Response:
    """The job search: by id (straight to the job), or by queue, type, state and arguments (a
    JSON object the job's arguments contain), newest first, `PAGE_SIZE` at a time (`after`:
    the last id of the page before). 400 for a malformed search; 503 when it takes longer than
    `SEARCH_TIMEOUT_MS` (it is cancelled)."""
    args = {k: v.strip() for k, v in request.args.items() if v.strip() and k != "done"}
    given = args.pop("id", None)
    if given is not None:
        job_id = parse_id(given)
        if job_id is None:
            return await _search_page(400, "An id is a whole number.", {})
        return _back("dashboard.job", job_id=job_id)
    try:
        arguments = _arguments(args.get("arguments"))
        query = JobsQuery.model_validate(
            {k: v for k, v in args.items() if k != "arguments"} | {"limit": PAGE_SIZE}
        )
    except ValidationError as exc:
        fields = ", ".join(str(e["loc"][0]) for e in exc.errors())
        return await _search_page(400, f"Not a valid search ({fields}).", args)
    except ValueError as exc:
        return await _search_page(400, f"Not a valid search ({exc}).", args)
    now = clock.now()
    try:
        async with db.transaction(readonly=True) as conn:
            await statements.setting_local.execute(
                conn, setting="statement_timeout", value=str(SEARCH_TIMEOUT_MS)
            )
            found = await control.list_jobs(
                conn,
                now=now,
                limit=PAGE_SIZE,
                after=query.after,
                queue=query.queue,
                job_type=query.job_type,
                state=query.state,
                arguments=arguments,
            )
            held = await _held(conn, found, now)
    except asyncpg.QueryCanceledError:
        error = (
            f"The search took longer than {SEARCH_TIMEOUT_MS / 1000:g} s and was stopped:"
            " few jobs match among many. Narrow it with a state."
        )
        return await _search_page(503, error, args)
    next_after = found[-1].id if len(found) == PAGE_SIZE else None
    return await _search_page(200, None, args, found, next_after, held)


@bp.post("/jobs/cancel")
@hide
@session.login_only
async def jobs_cancel() -> Response:
    """Cancel the ticked jobs (`id=<id>` each), each in its own transaction; a job finished
    already, or gone, is counted apart; one cancelled before is not audited again."""
    form = await request.form
    ids = form.getlist("id")
    job_ids = {parse_id(i) for i in ids}
    if not ids or None in job_ids:
        raise Conflict("tick at least one job, then press cancel")
    done, already, skipped = 0, 0, 0
    retain = _settings().retain
    for job_id in sorted(i for i in job_ids if i is not None):
        try:
            async with db.transaction() as conn:
                result = await control.cancel(conn, job_id, now=clock.now(), retain=retain)
        except (Conflict, NotFound):
            skipped += 1
            continue
        if result.already:
            already += 1
        else:
            audit("job.cancel", f"job:{job_id}")
            done += 1
    message = f"cancel: {done} job{'s' * (done != 1)}"
    if already:
        message += f"; {already} cancelled already"
    if skipped:
        message += f"; {skipped} finished already, or gone"
    return _back("dashboard.jobs", done=message, **dict(request.args))


@bp.get("/jobs/<int:job_id>")
@hide
@session.login_only
async def job(job_id: int) -> Response:
    """One job wherever it is: its state (held back, and why), arguments, attempts with their
    errors, its result."""
    now = clock.now()
    async with db.transaction(readonly=True) as conn:
        found = await control.find(conn, job_id, now=now)
        held = await _held(conn, [found], now) if found is not None else {}
    if found is None:
        return await _page("job.html", status=404, job=None, job_id=job_id, done=None)
    return await _page(
        "job.html", job=found, job_id=job_id, held=held, done=request.args.get("done")
    )


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
            elif (await control.cancel(conn, job_id, now=now, retain=_settings().retain)).already:
                return _back("dashboard.job", job_id=job_id, done="cancelled already")
    except (Conflict, NotFound) as exc:
        return _back("dashboard.job", job_id=job_id, done=f"not done: {exc.message}")
    audit("dead_job.retry" if verb == "retry" else "job.cancel", f"job:{job_id}")
    return _back("dashboard.job", job_id=job_id, done="retried" if verb == "retry" else "cancelled")


# -- the dead letter --------------------------------------------------------------------------


def _dead_filter(values: Any) -> tuple[DeadFilter, dict[str, str]]:
    """The dead letter's filter from a query string or a form (`queue`, `job_type`, `error`,
    `arguments`), and its fields as given. Raises: `ValueError`."""
    given = {k: values.get(k, "").strip() for k in ("queue", "job_type", "error", "arguments")}
    given = {k: v for k, v in given.items() if v}
    where = DeadFilter(
        queue=given.get("queue"),
        job_type=given.get("job_type"),
        error=given.get("error"),
        arguments=_arguments(given.get("arguments")),
    )
    return where, given


@bp.get("/dead")
@hide
@session.login_only
async def dead_letter() -> Response:
    """The dead letter, newest first, `PAGE_SIZE` at a time, filtered by queue, type, error
    text and arguments; each job with retry and discard, the ticked ones in bulk, and every one
    the filter matches."""
    after_id = parse_id(request.args.get("after", ""))
    try:
        where, given = _dead_filter(request.args)
    except ValueError as exc:
        return await _page(
            "dead.html", status=400, jobs=[], next_after=None, query={}, error=str(exc)
        )
    async with db.transaction(readonly=True) as conn:
        rows = await dead.list_dead(conn, limit=PAGE_SIZE, after=after_id, where=where)
    return await _page(
        "dead.html",
        jobs=rows,
        query=given,
        error=None,
        next_after=rows[-1]["id"] if len(rows) == PAGE_SIZE else None,
        done=request.args.get("done"),
    )


async def _one(verb: str, job_id: int) -> bool:
    """Retry or discard dead job `job_id` in its own transaction, audited; False when its twin
    is queued (retry) or it is gone."""
    try:
        async with db.transaction() as conn:
            if verb == "retry":
                await dead.retry(conn, job_id, now=clock.now())
            else:
                await dead.discard(conn, job_id)
    except (Conflict, NotFound):
        return False
    audit(f"dead_job.{verb}", f"job:{job_id}")
    return True


async def _every_matching(verb: str, where: DeadFilter) -> tuple[int, int, bool]:
    """Retry or discard every dead job `where` matches, `BULK_BATCH` at a time, newest first,
    for at most `BULK_BUDGET_S`: (done, left for a twin or gone, more to do)."""
    done, skipped, after = 0, 0, None
    deadline = time.monotonic() + BULK_BUDGET_S
    while True:
        async with db.transaction(readonly=True) as conn:
            ids = await dead.matching(conn, where, limit=BULK_BATCH, after=after)
        for job_id in ids:
            if await _one(verb, job_id):
                done += 1
            else:
                skipped += 1
        if len(ids) < BULK_BATCH:
            return done, skipped, False
        after = ids[-1]
        if time.monotonic() > deadline:
            return done, skipped, True


@bp.post("/dead")
@hide
@session.login_only
async def dead_action() -> Response:
    """Retry or discard dead jobs: one (`retry=<id>` or `discard=<id>`), those ticked
    (`action=retry|discard`, `id=<id>` each), or every one the filter matches
    (`action=retry_matching|discard_matching` with the filter's fields). Each job in its own
    transaction; one whose twin is queued (retry) or that is gone already is counted apart."""
    form = await request.form
    if "retry" in form or "discard" in form:
        verb = "retry" if "retry" in form else "discard"
        ids = [form[verb]]
    else:
        verb = form.get("action", "")
        ids = form.getlist("id")
    try:
        where, given = _dead_filter(form)
    except ValueError as exc:
        raise Conflict(str(exc)) from None
    more = False
    if verb in ("retry_matching", "discard_matching"):
        verb = verb.removesuffix("_matching")
        done, skipped, more = await _every_matching(verb, where)
    elif verb in ("retry", "discard") and ids and None not in {parse_id(i) for i in ids}:
        done = skipped = 0
        for job_id in sorted({i for i in map(parse_id, ids) if i is not None}):
            if await _one(verb, job_id):
                done += 1
            else:
                skipped += 1
    else:
        raise Conflict("tick at least one dead job, then press retry or discard")
    message = f"{verb}: {done} job{'s' * (done != 1)}"
    if skipped:
        message += f"; {skipped} left (an identical job is queued, or gone already)"
    if more:
        message += f"; stopped after {BULK_BUDGET_S:g} s with more to do: press again"
    return _back("dashboard.dead_letter", done=message, **given)
