"""`/jobs/stats`: the queue at a glance, and what pins the vacuum horizon of its tables.

It needs the admin token (`jobq.api.admin.admin_only`; 404 with none configured): it names the
job types and their counts, and costs a scan of the queue (about 0.1 s of database time at
100,000 queued jobs), neither of which is for anyone who asks."""

from __future__ import annotations

from pydantic import AwareDatetime, BaseModel, Field
from quart import Blueprint
from quart_schema import security_scheme_blueprint, validate_response

from jobq import clock, db
from jobq.api.admin import SECURITY_SCHEME, admin_only
from jobq.db import read_transaction
from jobq.queue import metrics

bp = Blueprint("jobs", __name__)
security_scheme_blueprint(bp, [{SECURITY_SCHEME: []}])


class JobTypeStats(BaseModel):
    """Counts of one job type: queued and ripe, queued for later, running, dead."""

    job_type: str
    ripe: int
    scheduled: int
    running: int
    dead: int


class TableStats(BaseModel):
    """One queue table as `pg_stat_user_tables` last saw it (it lags by a second or so)."""

    table: str
    n_live_tup: int
    n_dead_tup: int = Field(description="dead rows not yet removed by vacuum")
    last_autovacuum_at: AwareDatetime | None


class VacuumStats(BaseModel):
    """What pins the vacuum horizon: while a transaction stays open, vacuum removes none of the
    rows deleted since it began, and every job leaves dead rows in `job` and `job_running`."""

    oldest_transaction_s: float | None = Field(
        description="age in seconds of the oldest open transaction in this database, other "
        "than this request's (null: none)"
    )
    tables: list[TableStats]


class Stats(BaseModel):
    """Counts per job type, and their totals; the queue tables' vacuum figures."""

    job_types: list[JobTypeStats]
    totals: JobTypeStats
    queued_counted_at: AwareDatetime | None = Field(
        description="null: every count is of now; else the queue holds more than 100,000 jobs "
        "and its ripe and scheduled ones are as the last depth snapshot counted them (taken "
        "by a worker every few seconds), at this time"
    )
    vacuum: VacuumStats


@bp.get("/jobs/stats")
@admin_only
@validate_response(Stats)
@read_transaction
async def job_stats() -> Stats:
    """Queued (ripe and scheduled), running and dead jobs per job type; the age of the oldest
    open transaction and the queue tables' live and dead tuples (a pinned vacuum horizon)."""
    now = clock.now()
    counted, counted_at = await metrics.stats(db.conn(), now=now)
    rows = [JobTypeStats.model_validate(r) for r in counted]
    vacuum = VacuumStats.model_validate(await metrics.vacuum_stats(db.conn(), now=now))
    totals = JobTypeStats(
        job_type="*",
        ripe=sum(r.ripe for r in rows),
        scheduled=sum(r.scheduled for r in rows),
        running=sum(r.running for r in rows),
        dead=sum(r.dead for r in rows),
    )
    return Stats(job_types=rows, totals=totals, queued_counted_at=counted_at, vacuum=vacuum)
