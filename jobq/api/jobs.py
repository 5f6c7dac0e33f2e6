"""`/jobs/stats`: the queue at a glance."""

from __future__ import annotations

from pydantic import BaseModel
from quart import Blueprint
from quart_schema import validate_response

from jobq import clock, db
from jobq.db import read_transaction
from jobq.queue import store

bp = Blueprint("jobs", __name__)


class JobTypeStats(BaseModel):
    """Counts of one job type: queued and ripe, queued for later, running, dead."""

    job_type: str
    ripe: int
    scheduled: int
    running: int
    dead: int


class Stats(BaseModel):
    """Counts per job type, and their totals."""

    job_types: list[JobTypeStats]
    totals: JobTypeStats


@bp.get("/jobs/stats")
@validate_response(Stats)
@read_transaction
async def job_stats() -> Stats:
    """Queued (ripe and scheduled), running and dead jobs per job type."""
    rows = [JobTypeStats.model_validate(r) for r in await store.stats(db.conn(), now=clock.now())]
    totals = JobTypeStats(
        job_type="*",
        ripe=sum(r.ripe for r in rows),
        scheduled=sum(r.scheduled for r in rows),
        running=sum(r.running for r in rows),
        dead=sum(r.dead for r in rows),
    )
    return Stats(job_types=rows, totals=totals)
