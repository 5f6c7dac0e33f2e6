"""Metrics of the queue: job events and timings counted in memory, summed in the database.

Each process counts what it does in `tally`, a dict increment on the hot path: the jobs it
enqueued (after the commit: a rolled-back enqueue counts nothing), claimed (`started`, with the
pickup lag: claim time minus `ripe_at`), recorded (`succeeded`, `retried`, `failed` for the dead
letter, `snoozed`, with the handler's run time) and cancelled. Its `flusher` adds the counts to
`job_counter` and `job_histogram` about once a second, in one short transaction, and only when
there is something to add (an idle process writes nothing); a graceful stop flushes the rest.
So the counts are cumulative over every process on every host however many there are, and
survive restarts: the database adds, and a scrape of any web process reads the sums
(`jobq.api.metrics`). A process killed hard loses at most its last second of counts.

The queue depths need counting a big table, so a scrape does not count them: it reads the
snapshot that the leader takes every few seconds (`jobq.queue.leader.depth`).

What the API, the dashboard and the CLI read: `read` (the scrape), `stats` (jobs per type,
counted live up to `LIVE_COUNT_MAX` queued jobs, else from the depth snapshot), `vacuum_stats`,
`table_stats` and `event_counts`.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from jobq.db import Connection, Database, current_transaction
from jobq.queue import sql
from jobq.queue.model import ClaimedJob, Outcome, Verdict
from jobq.queue.service import Service

# `jobq.queue.store` counts its enqueues here: this module imports it where it uses it.

EVENTS = ("enqueued", "started", "succeeded", "retried", "failed", "cancelled", "snoozed")
"""The events counted per queue and job type (`job_counter.event`)."""

OUTCOME_EVENTS = {
    Verdict.COMPLETE: "succeeded",
    Verdict.RETRY: "retried",
    Verdict.BURY: "failed",
    Verdict.SNOOZE: "snoozed",
}
"""The event of a recorded outcome; a release (a stop gave the job back) is none."""

BOUNDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0, 300.0, 3600.0)
"""Upper bounds (seconds) of the histogram buckets, pickup lag and run time alike; above the
last one is +Inf. Fine from a millisecond (a job started by a notification) to a second, coarse
up to an hour: each bucket is a series of every queue and job type, and a scrape's time grows
with the series (prometheus-client formats ~20 us of CPU per sample)."""

Key = tuple[str, str, str]
"""(queue, job type, event or histogram name)."""


@dataclass
class Histogram:
    """Observations not flushed yet: `buckets[i]` counts those in (BOUNDS[i-1], BOUNDS[i]]
    (the last: above every bound), `sum` their total in seconds."""

    buckets: list[int] = field(default_factory=lambda: [0] * (len(BOUNDS) + 1))
    sum: float = 0.0

    def add(self, other: Histogram) -> None:
        self.buckets = [a + b for a, b in zip(self.buckets, other.buckets, strict=True)]
        self.sum += other.sum

    def fold(self, values: list[float]) -> None:
        """Add `values` (seconds; negative ones count as 0)."""
        for index, n in Counter(map(_bucket_of, values)).items():
            self.buckets[index] += n
        self.sum += sum(v for v in values if v > 0)


def _bucket_of(seconds: float) -> int:
    return bisect.bisect_left(BOUNDS, seconds)  # negative: the first bucket, as 0


FOLD_AT = 10_000
"""Observations of one histogram kept as raw values before they are folded into its buckets:
the hot path appends a float; the fold (mostly in C) runs at the flush, or at `FOLD_AT`."""


class Tally:
    """One process's counts and observations since its last flush."""

    def __init__(self) -> None:
        self.counts: Counter[Key] = Counter()
        self.observed: dict[Key, list[float]] = {}
        """Raw observations, folded into `histograms` by `take` (or at `FOLD_AT`)."""
        self.histograms: dict[Key, Histogram] = {}

    def count(self, queue: str, job_type: str, event: str, n: int = 1) -> None:
        """Count `n` `event`s (one of `EVENTS`) of jobs of `job_type` in `queue`."""
        self.counts[(queue, job_type, event)] += n

    def observe(self, queue: str, job_type: str, metric: str, seconds: float) -> None:
        """Observe `seconds` (below 0: 0) in histogram `metric` (`pickup_lag`, `run_time`)."""
        values = self.observed.get((queue, job_type, metric))
        if values is None:
            values = self.observed[(queue, job_type, metric)] = []
        values.append(seconds)
        if len(values) >= FOLD_AT:  # flushes fail for long (the database is down): stay small
            self._fold((queue, job_type, metric))

    def _fold(self, key: Key) -> None:
        self.histograms.setdefault(key, Histogram()).fold(self.observed.pop(key))

    def take(self) -> tuple[Counter[Key], dict[Key, Histogram]]:
        """Take what was counted so far (to be flushed, or `restore`d when that failed)."""
        for key in list(self.observed):
            self._fold(key)
        taken = self.counts, self.histograms
        self.counts, self.histograms = Counter(), {}
        return taken

    def restore(self, counts: Counter[Key], histograms: dict[Key, Histogram]) -> None:
        """Give back what `take` returned and could not be flushed."""
        self.counts.update(counts)
        for key, histogram in histograms.items():
            self.histograms.setdefault(key, Histogram()).add(histogram)


tally = Tally()
"""This process's tally: every `Worker`, enqueue and cancel of the process counts here."""


# -- where the events happen ------------------------------------------------------------------


def count_after_commit(jobs: Iterable[tuple[str, str]], event: str) -> None:
    """Count `event` once per (queue, job type) of `jobs` when the transaction in progress
    commits (never when it rolls back); outside a transaction, now."""
    pairs = list(jobs)
    if not pairs:
        return

    def count() -> None:
        for queue, job_type in pairs:
            tally.count(queue, job_type, event)

    tx = current_transaction()
    if tx is None:
        count()
    else:
        tx.after_commit.append(count)


def count_claimed(jobs: Iterable[ClaimedJob]) -> None:
    """Count the claimed `jobs` as `started`, with their pickup lag (claim time - ripe_at)."""
    counts, observe = tally.counts, tally.observe  # the hot path: ~1 us per job
    for job in jobs:
        counts[(job.queue, job.job_type, "started")] += 1
        observe(
            job.queue, job.job_type, "pickup_lag", (job.claimed_at - job.ripe_at).total_seconds()
        )


def count_recorded(job: ClaimedJob, outcome: Outcome) -> None:
    """Count the recorded `outcome` of `job` (none for a release, nor for a job its worker knew
    was cancelled: its cancel was counted)."""
    event = OUTCOME_EVENTS.get(outcome.verdict)
    if event is not None and not outcome.cancelled:
        tally.counts[(job.queue, job.job_type, event)] += 1


# -- into the database ------------------------------------------------------------------------


async def flush(database: Database, source: Tally | None = None) -> int:
    """Add the tally's counts and histograms to `job_counter` and `job_histogram` in one
    transaction (none when there is nothing to add); return how many rows it added to. On
    failure the tally keeps them for the next flush. Raises: `asyncpg.PostgresError` /
    `OSError`."""
    source = source or tally
    counts, histograms = source.take()
    counts = +counts  # drop zeros
    if not counts and not histograms:
        return 0
    try:
        keys = sorted(counts)
        ordered = sorted(histograms.items())
        async with database.pool.acquire() as conn, conn.transaction():
            if keys:
                await sql.job_counter_add.execute(
                    conn,
                    queues=[k[0] for k in keys],
                    job_types=[k[1] for k in keys],
                    events=[k[2] for k in keys],
                    counts=[counts[k] for k in keys],
                )
            if ordered:
                await conn.executemany(
                    sql.job_histogram_add.text,
                    [
                        sql.job_histogram_add.args(
                            queue=q,
                            job_type=t,
                            metric=m,
                            bounds=list(BOUNDS),
                            buckets=h.buckets,
                            sum=h.sum,
                        )
                        for (q, t, m), h in ordered
                    ],
                )
    except BaseException:
        source.restore(counts, histograms)
        raise
    return len(keys) + len(ordered)


def flusher(database: Database, interval: timedelta) -> Service:
    """The service that `flush`es this process's tally every `interval`."""

    async def once() -> int:
        return await flush(database)

    return Service("metrics flush", interval, once)


# -- what a scrape reads ----------------------------------------------------------------------


@dataclass(frozen=True)
class Reading:
    """What `/metrics` exposes, read at `now` (see `read`)."""

    now: datetime
    counters: list[dict[str, Any]]
    histograms: list[dict[str, Any]]
    queues: list[dict[str, Any]]
    running: list[dict[str, Any]]
    workers_alive: int
    vacuum: dict[str, Any]
    flows: dict[str, int]
    """`waiting`: jobs waiting for other jobs (counted up to a million); `open_workflows`:
    workflows not seen ended (`jobq.queue.workflows`)."""


async def read(conn: Connection, *, now: datetime, heartbeat_grace: timedelta) -> Reading:
    """Read the metrics at `now`: the cumulative counts and histograms, per queue its state,
    depth snapshot and oldest ripe job, the running jobs, the workers alive, the vacuum
    figures (`vacuum_stats`) and the jobs and workflows that wait. Small tables and index
    probes only: no count over `job`.
    Raises: `asyncpg.PostgresError`."""
    return Reading(
        now=now,
        counters=[dict(r) for r in await sql.metrics_counters.fetch(conn)],
        histograms=[dict(r) for r in await sql.metrics_histograms.fetch(conn)],
        queues=[dict(r) for r in await sql.metrics_queues.fetch(conn, now=now)],
        running=[dict(r) for r in await sql.metrics_running.fetch(conn)],
        workers_alive=await sql.metrics_workers_alive.fetchval(
            conn, now=now, heartbeat_grace=heartbeat_grace
        ),
        vacuum=await vacuum_stats(conn, now=now),
        flows=dict(await sql.job_flow_counts.fetchrow(conn)),
    )


LIVE_COUNT_MAX = 100_000
"""The most queued jobs that the views count live (`stats`, the dashboard's depths): past it,
counting `job` costs a second per few million jobs, and they read the depth snapshot (or stop
counting) instead."""


async def snapshot_counts(conn: Connection, *, max_count: int | None = None) -> datetime | None:
    """When the queued jobs are to be read from the last depth snapshot rather than counted: its
    time (aware UTC) while `job` holds more than `max_count` jobs (None: `LIVE_COUNT_MAX`) and a
    snapshot exists (`take_depth_snapshot`, every few seconds by one
    worker); else None, they are counted now (a small queue, or no snapshot yet)."""
    max_count = LIVE_COUNT_MAX if max_count is None else max_count
    if not await sql.job_count_over.fetchval(conn, max_count=max_count):
        return None
    taken_at: datetime | None = await sql.job_depth_taken_at.fetchval(conn)
    return taken_at


async def stats(
    conn: Connection, *, now: datetime, max_count: int | None = None
) -> tuple[list[dict[str, Any]], datetime | None]:
    """Return per job type (by name) its `ripe` and `scheduled` queued jobs, `running` and
    `dead`, and when the queued ones were counted: None when counted now, at `now` (aware UTC),
    else the time of the depth snapshot they come from (`snapshot_counts`, with `max_count`).
    Running and dead jobs are always counted now."""
    counted_at = await snapshot_counts(conn, max_count=max_count)
    if counted_at is not None:
        return [dict(r) for r in await sql.job_stats_counted.fetch(conn)], counted_at
    return [dict(r) for r in await sql.job_stats.fetch(conn, now=now)], None


async def vacuum_stats(conn: Connection, *, now: datetime) -> dict[str, Any]:
    """Return what an operator needs to see the vacuum horizon pinned: `oldest_transaction_s`,
    the age in seconds at `now` of the oldest transaction open in this database other than
    ours (None when there is none), and `tables`: per queue table (`job`, `job_dead`,
    `job_running`) `n_live_tup`, `n_dead_tup` and `last_autovacuum_at` (None if never), from
    `pg_stat_user_tables`, which lags the tables by up to a second or so."""
    oldest: float | None = await sql.job_stats_oldest_transaction.fetchval(conn, now=now)
    tables = [dict(r) for r in await sql.job_stats_tables.fetch(conn)]
    return {"oldest_transaction_s": oldest, "tables": tables}


async def table_stats(conn: Connection) -> list[dict[str, Any]]:
    """Return per queue table (`job`, `job_running`, `job_dead`, `job_done`, `job_attempt`;
    those that exist), its partitions summed: `total_bytes` on disk (heap, indexes, TOAST),
    `n_live_tup` and `n_dead_tup` (None before the statistics saw it) and
    `last_autovacuum_at` (None if never), from the catalog and `pg_stat_user_tables`."""
    return [dict(r) for r in await sql.job_stats_sizes.fetch(conn)]


async def event_counts(conn: Connection) -> dict[str, dict[str, int]]:
    """Return the cumulative event counts of every queue, `{queue: {event: count}}`, summed
    over all processes from `job_counter` (written by `jobq.queue.metrics`). A rate is the
    change of a count between two readings over their interval."""
    counts: dict[str, dict[str, int]] = {}
    for r in await sql.job_counter_sums.fetch(conn):
        counts.setdefault(r["queue"], {})[r["event"]] = r["count"]
    return counts
