"""Large tables for the benchmarks that must hold at size: millions of queued and finished jobs,
made by the server itself (`generate_series`, one statement per chunk), not row by row.

`fill_queued` puts jobs in `job`: `ripe` of them ripe (at `now` minus up to a minute) and
`scheduled` of them due a year later (spread over a day), on `queue`, with priorities 0-2 and
distinct arguments (so the dedup index takes them all); its indexes (all but the primary key)
are dropped first and built again at the end. `fill_finished` puts succeeded jobs in
`job_done`, finished over the `days` days before `now`, each day in a partition of its own as
the pruner would have made it (`jobq.queue.leader.prune.partition_name`). Both run `ANALYZE`
at the end, as autovacuum would soon after, so plans are those of a settled database. About
1 million rows per 5-10 s on a 2-core machine.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from bench.context import Context
from jobq.db import Connection
from jobq.queue.leader.prune import partition_name

CHUNK = 1_000_000
"""Rows per INSERT: one transaction each, so a fill never holds one huge transaction."""


async def fill_queued(
    conn: Connection,
    *,
    ripe: int,
    scheduled: int,
    now: datetime,
    queue: str = "default",
    job_type: str = "bench_noop",
) -> float:
    """Insert `ripe` ripe and `scheduled` scheduled jobs of `job_type` on `queue` (`now`: an
    aware UTC datetime); return the seconds it took. Arguments are `{"big": <n>}`, n counting
    from the table's largest id, so two fills never collide on the dedup index."""
    started = time.perf_counter()
    base = await conn.fetchval("SELECT coalesce(max(id), 0) FROM job")
    # Indexes are built once at the end (a sorted build), not row by row: ten times faster.
    indexes = await conn.fetch(
        "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'job'"
        " AND indexname <> 'job_pkey'"
    )
    for index in indexes:
        await conn.execute(f"DROP INDEX {index['indexname']}")
    for offset, count, ripe_at, spread in (
        (0, ripe, now - timedelta(minutes=1), timedelta(minutes=1)),
        (ripe, scheduled, now + timedelta(days=365), timedelta(days=1)),
    ):
        for start in range(0, count, CHUNK):
            n = min(CHUNK, count - start)
            await conn.execute(
                """
                INSERT INTO job (job_type, arguments, ripe_at, priority, max_retries,
                                 created_at, queue)
                SELECT $1, jsonb_build_object('big', g),
                       $2::timestamptz + $3::interval * ((g % 997) / 997.0),
                       (g % 3)::smallint, 3, $4, $5
                FROM generate_series($6::bigint, $7::bigint) AS g
                """,
                job_type,
                ripe_at,
                spread,
                now,
                queue,
                base + offset + start + 1,
                base + offset + start + n,
            )
    await conn.execute("SET maintenance_work_mem = '1GB'")
    for index in indexes:
        await conn.execute(index["indexdef"])
    await conn.execute("RESET maintenance_work_mem")
    await conn.execute("ANALYZE job")
    return time.perf_counter() - started


async def fill_finished(
    conn: Connection,
    *,
    count: int,
    now: datetime,
    days: int = 6,
    queue: str = "default",
    job_type: str = "bench_noop",
) -> float:
    """Insert `count` succeeded jobs into `job_done`, finished over the `days` UTC days before
    `now`'s (each day's partition made first, as the pruner makes them); return the seconds it
    took. Their ids start above the largest of `job` and `job_done`."""
    started = time.perf_counter()
    base = await conn.fetchval(
        "SELECT greatest((SELECT coalesce(max(id), 0) FROM job),"
        " (SELECT coalesce(max(id), 0) FROM job_done))"
    )
    today = now.astimezone(UTC).date()
    for back in range(1, days + 1):
        day = today - timedelta(days=back)
        name = partition_name(day)
        start_at = datetime(day.year, day.month, day.day, tzinfo=UTC)
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS {name} PARTITION OF job_done"
            f" FOR VALUES FROM ('{start_at.isoformat()}')"
            f" TO ('{(start_at + timedelta(days=1)).isoformat()}')"
        )
    per_day = -(-count // days)
    for back in range(1, days + 1):
        day_start = datetime.combine(today - timedelta(days=back), datetime.min.time(), UTC)
        first = (back - 1) * per_day
        for start in range(first, min(first + per_day, count), CHUNK):
            n = min(CHUNK, first + per_day - start, count - start)
            await conn.execute(
                """
                INSERT INTO job_done (id, job_type, queue, arguments, state, attempts, result,
                                      created_at, finished_at)
                SELECT g, $1, $2, jsonb_build_object('big', g), 'succeeded', 1, NULL,
                       $3::timestamptz + interval '1 second' * (g % 86000),
                       $3::timestamptz + interval '1 second' * (g % 86000) + interval '10 ms'
                FROM generate_series($4::bigint, $5::bigint) AS g
                """,
                job_type,
                queue,
                day_start,
                base + start + 1,
                base + start + n,
            )
    await conn.execute("ANALYZE job_done")
    return time.perf_counter() - started


_filled: dict[str, tuple[str, float]] = {}
"""Per benchmark database (by DSN): what fills it now, and the seconds that fill took."""


async def filled_once(
    ctx: Context, name: str, fill: Callable[[Connection], Awaitable[None]]
) -> float:
    """Empty the benchmark database and `fill` it (on a connection of its own), unless the fill
    named `name` is what it holds already: the first run of a workload fills, the next runs
    reuse. Return the seconds the fill took (when it ran), then `VACUUM ANALYZE` of `job`."""
    if _filled.get(ctx.dsn, ("", 0.0))[0] != name:
        await ctx.database.reset()
        async with ctx.connection() as conn:
            started = time.perf_counter()
            await fill(conn)
            await conn.execute("VACUUM ANALYZE job")
            _filled[ctx.dsn] = (name, round(time.perf_counter() - started, 1))
    return _filled[ctx.dsn][1]
