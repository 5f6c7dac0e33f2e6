"""Admin endpoints of the queues: `GET /queues` (depth, running, limits, paused) and
`POST /queues/<name>/pause|resume`. Each needs the admin token (`jobq.api.admin.admin_only`).
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel
from quart import Blueprint
from quart_schema import security_scheme_blueprint, validate_response

from jobq import clock, db
from jobq.api.admin import SECURITY_SCHEME, admin_only
from jobq.api.audit import audit
from jobq.db import read_transaction, write_transaction
from jobq.errors import NotFound
from jobq.queue import limits

bp = Blueprint("queues", __name__)
security_scheme_blueprint(bp, [{SECURITY_SCHEME: []}])


class RateLimit(BaseModel):
    """At most `max_starts` job starts (claims) in any `period_s` seconds."""

    max_starts: int
    period_s: float


class QueueInfo(BaseModel):
    """A queue: `paused` (claimed by no worker), its limits across all workers (null: none)
    and its jobs now: `ripe` (queued, due), `scheduled` (queued, due later), `running`."""

    name: str
    paused: bool
    max_running: int | None
    max_running_per_key: int | None
    rate: RateLimit | None
    rate_per_key: RateLimit | None
    ripe: int
    scheduled: int
    running: int


class Queues(BaseModel):
    """Every queue, by name."""

    queues: list[QueueInfo]


def _rate(max_starts: int | None, period: timedelta | None) -> RateLimit | None:
    if max_starts is None or period is None:
        return None
    return RateLimit(max_starts=max_starts, period_s=period.total_seconds())


@bp.get("/queues")
@admin_only
@validate_response(Queues)
@read_transaction
async def list_queues() -> Queues:
    """Every queue with its depth, running jobs, limits and paused state."""
    rows = await limits.list_queues(db.conn(), now=clock.now())
    return Queues(
        queues=[
            QueueInfo(
                name=r["name"],
                paused=r["paused"],
                max_running=r["max_running"],
                max_running_per_key=r["max_running_per_key"],
                rate=_rate(r["rate_max_starts"], r["rate_period"]),
                rate_per_key=_rate(r["key_rate_max_starts"], r["key_rate_period"]),
                ripe=r["ripe"],
                scheduled=r["scheduled"],
                running=r["running"],
            )
            for r in rows
        ]
    )


async def _set_paused(name: str, *, paused: bool) -> tuple[str, int]:
    if not await limits.pause_queue(db.conn(), name, paused=paused):
        raise NotFound("no such queue", queue=name)
    audit(f"queue.{'pause' if paused else 'resume'}", f"queue:{name}")
    return "", 204


@bp.post("/queues/<queue:name>/pause")
@admin_only
@write_transaction
async def pause_queue(name: str) -> tuple[str, int]:
    """Pause a queue for every worker: none claims its jobs from the commit on (running jobs
    finish; enqueueing still works). 404 for an unknown queue."""
    return await _set_paused(name, paused=True)


@bp.post("/queues/<queue:name>/resume")
@admin_only
@write_transaction
async def resume_queue(name: str) -> tuple[str, int]:
    """Resume a paused queue; the workers are woken at once. 404 for an unknown queue."""
    return await _set_paused(name, paused=False)
