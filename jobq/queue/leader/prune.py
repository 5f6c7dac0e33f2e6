"""Retention of finished jobs: day partitions made ahead and dropped when they expire, the rest
pruned by rows in batches (`prune_finished`, the leader's `pruner`)."""

from __future__ import annotations

import logging
from datetime import UTC, date, datetime, time, timedelta

import asyncpg

from jobq import clock
from jobq.config import Settings
from jobq.db import Connection, Database
from jobq.queue import sql, workflows
from jobq.queue.service import Service

log = logging.getLogger("jobq.worker")


PARTITIONS_AHEAD = 2
"""Days of partitions made ahead (UTC): tomorrow's and the next. Never today's: attaching a
partition while a statement routes a row of its range to the default partition fails that
statement (PostgreSQL checks the row against the default's new constraint), so a day's
partition is attached before any row of it can exist. On a database's first day, its rows
go to the default partition."""

BY_DAY = {"job_done": sql.job_done_prune_default, "job_attempt": sql.job_attempt_prune_default}
"""The tables partitioned by UTC day (finished jobs, failed attempts), and the statement that
prunes each one's default partition."""

DDL_LOCK_TIMEOUT = "100ms"
"""How long the pruner's DDL waits for a lock before giving up until its next round: while it
waits, the statements that finish jobs queue behind it."""


def partition_name(day: date, table: str = "job_done") -> str:
    """The name of `table`'s partition of UTC day `day`: `<table>_pYYYYMMDD`."""
    return f"{table}_p{day:%Y%m%d}"


async def prune_finished(
    database: Database, *, now: datetime, retention: timedelta, batch: int = 5000
) -> int:
    """One round of retention on `job_done` and `job_attempt` (`BY_DAY`): make the partitions
    of the next `PARTITIONS_AHEAD` days (UTC), drop those whose day ended `retention`
    before `now` (a drop is instant and leaves nothing to vacuum), and delete the default
    partitions' rows older than `now - retention` in transactions of `batch` rows; then forget
    the free keys of `job_unique` (`jobq.queue.model.Unique`), the schedules' occurrences
    older than the retention (and a day), `batch` at a time, and the workflows ended longer
    than the retention ago (`jobq.queue.workflows.prune_flows`). Return how
    many rows went from the default partitions (a dropped partition's rows are not counted).

    Each step is a short transaction of its own (so it works through a pooler); DDL gives up
    after `DDL_LOCK_TIMEOUT` and is tried again next round, and the pruners of several workers
    at once only make each other's DDL fail (logged) or delete nothing. A partition cannot be
    made for a day the default partition holds rows of (clocks far off): that day's rows stay
    in the default, pruned by rows.
    Raises: `asyncpg.PostgresError` / `OSError`.
    """
    cutoff = now - retention
    today = now.astimezone(UTC).date()
    pruned = 0
    async with database.pool.acquire() as conn:
        for table, prune_default in BY_DAY.items():
            partitions = await sql.job_day_partitions.fetch(conn, parent=table)
            existing = {r["relname"] for r in partitions}
            for ahead in range(1, PARTITIONS_AHEAD + 1):
                day = today + timedelta(days=ahead)
                if partition_name(day, table) not in existing:
                    await _ddl(conn, _create_partition(table, day))
            for name in sorted(existing):
                day = datetime.strptime(name.removeprefix(f"{table}_p"), "%Y%m%d").date()
                if datetime.combine(day + timedelta(days=1), time(), UTC) <= cutoff:
                    await _ddl(conn, f"DROP TABLE IF EXISTS {name}")
            while True:
                count: int = await prune_default.fetchval(conn, cutoff=cutoff, batch=batch)
                pruned += count
                if count < batch:
                    break
        while await sql.job_unique_prune.fetchval(conn, now=now, batch=batch) == batch:
            pass
        occurrences = min(cutoff, now - timedelta(days=1))
        while (
            await sql.job_occurrence_prune.fetchval(conn, cutoff=occurrences, batch=batch) == batch
        ):
            pass
        await workflows.prune_flows(conn, now=now, retention=retention)
    return pruned


def _create_partition(table: str, day: date) -> str:
    start = datetime.combine(day, time(), UTC)
    end = start + timedelta(days=1)
    name = partition_name(day, table)
    # CREATE then ATTACH: attaching locks the parent SHARE UPDATE EXCLUSIVE, which lets jobs go
    # on finishing (CREATE ... PARTITION OF would lock it ACCESS EXCLUSIVE).
    return (
        f"CREATE TABLE {name} (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS);"
        f" ALTER TABLE {table} ATTACH PARTITION {name}"
        f" FOR VALUES FROM ('{start.isoformat()}') TO ('{end.isoformat()}')"
    )


async def _ddl(conn: Connection, statement: str) -> None:
    """Run `statement` in a transaction that waits at most `DDL_LOCK_TIMEOUT` for its locks;
    log (not raise) its failure (a lock timeout, a default partition holding rows of the day,
    another pruner that did it first): the next round tries again."""
    try:
        async with conn.transaction():
            await sql.setting_local.execute(conn, setting="lock_timeout", value=DDL_LOCK_TIMEOUT)
            await conn.execute(statement)
    except asyncpg.PostgresError as exc:
        log.info("retention: %s failed (%s); next round", statement.split(";")[0], exc)


def pruner(database: Database, settings: Settings) -> Service:
    """Retention of finished jobs (`prune_finished`), every `settings.prune_interval`."""

    async def prune() -> int:
        return await prune_finished(database, now=clock.now(), retention=settings.retention)

    return Service("prune", settings.prune_interval, prune)
