"""Admin endpoints: any job by id (`/jobs/<id>`: look, wait, cancel), the dead letter
(`/jobs/dead`) and the workers (`/workers`).

Each needs `Authorization: Bearer <JOBQ_ADMIN_TOKEN>`, compared in constant time. With no token
configured they answer 404, like any unknown URL; a missing or wrong token gets 401 with
`WWW-Authenticate: Bearer` and the JSON error body. The check runs before the query string is
validated, so an unauthorised caller learns nothing from that.
"""

from __future__ import annotations

import functools
import hmac
import logging
from collections.abc import Awaitable, Callable, Coroutine
from datetime import datetime
from typing import Annotated, Any, ParamSpec, TypeVar

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema
from quart import Blueprint, current_app, request
from quart_schema import security_scheme_blueprint, validate_querystring, validate_response
from werkzeug.datastructures import WWWAuthenticate
from werkzeug.exceptions import NotFound, Unauthorized

from jobq import clock, db, errors
from jobq.api import throttle
from jobq.api.audit import audit
from jobq.config import Settings
from jobq.db import read_transaction, write_transaction
from jobq.domain.types import BIGINT_MAX
from jobq.queue import control, dead
from jobq.queue.control import Arguments, JobState, JobView

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

SECURITY_SCHEME = "admin_token"
"""The OpenAPI security scheme (HTTP bearer) of these endpoints; `jobq.app` declares it."""

bp = Blueprint("admin", __name__)
security_scheme_blueprint(bp, [{SECURITY_SCHEME: []}])


class Refused(Unauthorized):
    """401: the admin token is missing or wrong. `reason` says which, for the log."""

    def __init__(self, reason: str, error: str | None) -> None:
        challenge = WWWAuthenticate("bearer", {"realm": "jobq admin"})
        if error is not None:
            challenge["error"] = error  # RFC 6750, 3.1
        super().__init__(
            "send Authorization: Bearer <JOBQ_ADMIN_TOKEN>", www_authenticate=challenge
        )
        self.reason = reason


def authorize(settings: Settings, authorization: str | None) -> None:
    """Return when `authorization` (an `Authorization` header) is `Bearer <admin_token>`.

    The token is compared with `hmac.compare_digest` (its time does not depend on where the
    tokens differ). Raises: `NotFound` when no admin token is configured; `Refused` (401, with
    a `WWW-Authenticate: Bearer` challenge) when the header is missing, not a bearer token,
    or the wrong token. Neither the expected nor the given token is logged or echoed.
    """
    if settings.admin_token is None:
        raise NotFound()
    if not authorization:
        raise Refused("no token", None)
    scheme, _, given = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        raise Refused("not a bearer token", None)  # another scheme: no error code (RFC 6750)
    if not given.strip():
        raise Refused("empty bearer token", "invalid_request")
    expected = settings.admin_token.get_secret_value().encode()
    if not hmac.compare_digest(given.strip().encode(), expected):
        raise Refused("wrong token", "invalid_token")


def authorize_request(settings: Settings, what: str = "admin request") -> None:
    """Return when this request carries the admin token (`authorize`), counting a wrong one
    against its client's address (`jobq.api.throttle`) and logging refusals as `what`.
    Raises: `NotFound` with no token configured; `TooManyRequests` (429) while the address
    has no failed attempt left, before the token is looked at; `Refused` (401)."""
    if settings.admin_token is None:
        raise NotFound()
    authorization = request.headers.get("Authorization")
    if authorization:
        throttle.check_failures()
    try:
        authorize(settings, authorization)
    except Refused as exc:
        log.warning("%s refused (%s): %s %s", what, exc.reason, request.method, request.path)
        if authorization:
            throttle.record_failure()
        raise


def admin_only(
    fn: Callable[P, Awaitable[T]],
) -> Callable[P, Coroutine[Any, Any, T]]:
    """Require the admin token (see `authorize_request`) before `fn` runs. Put it right under
    the route decorator, above the validation decorators."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        authorize_request(current_app.extensions["jobq.settings"])
        return await fn(*args, **kwargs)

    return wrapper


# -- any job ---------------------------------------------------------------------------------


MAX_WAIT_S = 60


class JobQuery(BaseModel):
    """`GET /jobs/<id>` query: `wait` (seconds, 0-60, default 0): answer as soon as the job
    finishes, or after that long with its state then."""

    model_config = ConfigDict(extra="forbid")

    wait: float = Field(default=0, ge=0, le=MAX_WAIT_S)


class CancelledJob(BaseModel):
    """A cancelled job: `cancelled` (it left the queue), or `running` (its worker was told; it
    ends `cancelled` whatever its handler does, and never runs again). `already_cancelled`:
    it was cancelled before this request, which changed nothing."""

    id: int
    state: JobState
    already_cancelled: bool


class Jobs(BaseModel):
    """A page of jobs, newest (highest id) first. `next_after`: pass it as `after` for the next
    page; null on the last page."""

    jobs: list[JobView]
    next_after: int | None


class JobsQuery(BaseModel):
    """`GET /jobs` query: `queue`, `job_type`, `state` (each: any when absent), `limit` (1-500,
    default 100) and `after` (the last id of the previous page)."""

    model_config = ConfigDict(extra="forbid")

    queue: str | SkipJsonSchema[None] = Field(default=None, pattern=r"^[a-z][a-z0-9_.:-]{0,62}$")
    job_type: str | SkipJsonSchema[None] = Field(default=None, pattern=r"^[a-z][a-z0-9_.:-]{0,99}$")
    state: JobState | SkipJsonSchema[None] = None
    limit: int = Field(default=100, ge=1, le=500)
    after: Annotated[int, Field(ge=1, le=BIGINT_MAX)] | SkipJsonSchema[None] = None


@bp.get("/jobs")
@admin_only
@validate_querystring(JobsQuery)
@validate_response(Jobs)
@read_transaction
async def list_jobs(query_args: JobsQuery) -> Jobs:
    """Every job wherever it is (queued, running, finished, dead), newest first, a page at a
    time, filtered by `queue`, `job_type` and `state`."""
    jobs = await control.list_jobs(
        db.conn(),
        now=clock.now(),
        limit=query_args.limit,
        after=query_args.after,
        queue=query_args.queue,
        job_type=query_args.job_type,
        state=query_args.state,
    )
    more = len(jobs) == query_args.limit
    return Jobs(jobs=jobs, next_after=jobs[-1].id if jobs and more else None)


@bp.get("/jobs/<int:job_id>")
@admin_only
@validate_querystring(JobQuery)
@validate_response(JobView)
async def get_job(job_id: int, query_args: JobQuery) -> JobView:
    """A job wherever it is: `scheduled`, `queued`, `running`, `succeeded`, `failed` (the dead
    letter) or `cancelled`, with its result once succeeded. With `wait`, the answer comes as
    soon as the job finishes (woken by a notification), or after `wait` seconds. No
    transaction is held while it waits."""
    database = db.current_database()
    if query_args.wait > 0:
        return await control.await_end(job_id, query_args.wait, database=database)
    async with database.pool.acquire() as conn:
        job = await control.find(conn, job_id, now=clock.now())
    if job is None:
        raise errors.NotFound("no such job", job_id=job_id)
    return job


@bp.post("/jobs/<int:job_id>/cancel")
@admin_only
@validate_response(CancelledJob)
@write_transaction
async def cancel_job(job_id: int) -> CancelledJob:
    """Cancel a job whatever its state: queued or scheduled, it leaves the queue now; running,
    its worker is told at once (an async handler is cancelled, a synchronous one sees
    `JobContext.cancelled`). A cancelled job never runs again, and no later outcome changes
    it. 409 when it succeeded or failed already; a second cancel changes nothing (and is not
    audited): `already_cancelled`."""
    settings: Settings = current_app.extensions["jobq.settings"]
    done = await control.cancel(db.conn(), job_id, now=clock.now(), retain=settings.retain)
    if not done.already:
        audit("job.cancel", f"job:{job_id}")
    return CancelledJob(id=job_id, state=done.state, already_cancelled=done.already)


# -- the dead letter ---------------------------------------------------------------------------


class DeadJob(BaseModel):
    """A job in the dead letter: retries exhausted, a non-retryable error, invalid arguments,
    no handler, or merged into a queued duplicate (`last_error` says which)."""

    id: int
    job_type: str
    arguments: Arguments
    priority: int
    attempts: int
    max_retries: int
    last_error: str | None
    created_at: AwareDatetime
    died_at: AwareDatetime


class DeadJobs(BaseModel):
    """A page of dead jobs, newest (highest id) first. `next_after`: pass it as `after` for the
    next page; null on the last page."""

    jobs: list[DeadJob]
    next_after: int | None


class DeadJobsQuery(BaseModel):
    """`GET /jobs/dead` query: `limit` (1-500, default 100) and `after` (the last id of the
    previous page)."""

    model_config = ConfigDict(extra="forbid")

    limit: int = Field(default=100, ge=1, le=500)
    after: Annotated[int, Field(ge=1, le=BIGINT_MAX)] | SkipJsonSchema[None] = None


class QueuedJob(BaseModel):
    """A job back in the queue."""

    id: int
    job_type: str
    arguments: Arguments
    ripe_at: AwareDatetime
    priority: int
    attempts: int
    max_retries: int
    last_error: str | None
    created_at: AwareDatetime


@bp.get("/jobs/dead")
@admin_only
@validate_querystring(DeadJobsQuery)
@validate_response(DeadJobs)
@read_transaction
async def list_dead_jobs(query_args: DeadJobsQuery) -> DeadJobs:
    """The dead letter, newest (highest id) first, a page at a time (`limit`, `after`)."""
    rows = await dead.list_dead(db.conn(), limit=query_args.limit, after=query_args.after)
    jobs = [DeadJob.model_validate(r) for r in rows]
    more = len(jobs) == query_args.limit
    return DeadJobs(jobs=jobs, next_after=jobs[-1].id if jobs and more else None)


@bp.post("/jobs/dead/<int:job_id>/retry")
@admin_only
@validate_response(QueuedJob)
@write_transaction
async def retry_dead_job(job_id: int) -> QueuedJob:
    """Move a dead job back to the queue, ripe now, with its retries reset (`attempts` 0).

    409 (with `queued_job_id`) when an identical job is queued: the dead job stays.
    """
    return await _retry_dead(job_id, clock.now())


@bp.post("/jobs/<int:job_id>/retry")
@admin_only
@validate_response(QueuedJob)
@write_transaction
async def retry_job(job_id: int) -> QueuedJob:
    """Put a failed job (in the dead letter) back in the queue, ripe now, its retries reset:
    the same as `POST /jobs/dead/<id>/retry`. 409 when the job is not failed (or an identical
    job is queued), 404 when there is no such job."""
    now = clock.now()
    try:
        return await _retry_dead(job_id, now)
    except errors.NotFound:
        job = await control.find(db.conn(), job_id, now=now)
        if job is None:
            raise
        raise errors.Conflict(
            f"only a failed job can be retried; this one is {job.state}", job_id=job_id
        ) from None


async def _retry_dead(job_id: int, now: datetime) -> QueuedJob:
    row = await dead.retry(db.conn(), job_id, now=now)
    audit("dead_job.retry", f"job:{job_id} ({row['job_type']})")
    return QueuedJob.model_validate(row)


@bp.delete("/jobs/dead/<int:job_id>")
@admin_only
@write_transaction
async def discard_dead_job(job_id: int) -> tuple[str, int]:
    """Delete a dead job for good."""
    await dead.discard(db.conn(), job_id)
    audit("dead_job.discard", f"job:{job_id}")
    return "", 204


# -- workers -----------------------------------------------------------------------------------


class WorkerInfo(BaseModel):
    """A registered worker process. `alive` follows the rescue's rule (its liveness lock is
    held, or its process still has a session and a recent heartbeat); `running_jobs` counts
    the jobs it holds."""

    id: int
    host: str
    pid: int
    started_at: AwareDatetime
    heartbeat_at: AwareDatetime
    alive: bool
    running_jobs: int


class Workers(BaseModel):
    """The registered workers, by id."""

    workers: list[WorkerInfo]


@bp.get("/workers")
@admin_only
@validate_response(Workers)
@read_transaction
async def list_workers() -> Workers:
    """The registered workers, alive or not yet forgotten by a rescue."""
    settings: Settings = current_app.extensions["jobq.settings"]
    rows = await dead.list_workers(
        db.conn(),
        now=clock.now(),
        heartbeat_grace=settings.heartbeat_grace,
    )
    return Workers(workers=[WorkerInfo.model_validate(r) for r in rows])
