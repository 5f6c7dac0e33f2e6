"""A journal of every claim, kept by PostgreSQL itself, and the arithmetic of limits over it.

`install(conn)` adds a trigger that copies each row inserted in `job_running` (a claim, by any
worker of any process) to `test_claim`; `uninstall(conn)` removes it. The limits are then
checked on what happened, not on the engine's own counters: `max_overlap` of running intervals
and `max_starts_in_window` of claim times.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import TypeVar

import asyncpg

from jobq.db import Connection

T = TypeVar("T", float, datetime)

_INSTALL = """
CREATE TABLE IF NOT EXISTS test_claim (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id          bigint      NOT NULL,
    queue           text        NOT NULL,
    concurrency_key text,
    attempts        integer     NOT NULL,
    worker_id       integer     NOT NULL,
    claimed_at      timestamptz NOT NULL
);
TRUNCATE test_claim RESTART IDENTITY;
CREATE OR REPLACE FUNCTION test_claim_log() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO test_claim (job_id, queue, concurrency_key, attempts, worker_id, claimed_at)
    VALUES (NEW.id, NEW.queue, NEW.concurrency_key, NEW.attempts, NEW.worker_id, NEW.claimed_at);
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS test_claim_log ON job_running;
CREATE TRIGGER test_claim_log AFTER INSERT ON job_running
    FOR EACH ROW EXECUTE FUNCTION test_claim_log();
"""

_UNINSTALL = """
DROP TRIGGER IF EXISTS test_claim_log ON job_running;
DROP FUNCTION IF EXISTS test_claim_log();
DROP TABLE IF EXISTS test_claim;
"""


async def install(conn: Connection) -> None:
    """Start journaling claims in `test_claim` (emptied)."""
    await conn.execute(_INSTALL)


async def uninstall(conn: Connection) -> None:
    """Stop journaling claims and drop the journal."""
    await conn.execute(_UNINSTALL)


async def claims(conn: Connection, queue: str) -> list[asyncpg.Record]:
    """The claims of `queue` so far, in claim order."""
    rows: list[asyncpg.Record] = await conn.fetch(
        "SELECT * FROM test_claim WHERE queue = $1 ORDER BY claimed_at, id", queue
    )
    return rows


def max_overlap(intervals: Iterable[tuple[T, T]]) -> int:
    """The most intervals `[start, end)` open at any one instant (an end before a start at the
    same instant)."""
    spans = list(intervals)
    events = sorted(
        [(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans],
        key=lambda e: (e[0], e[1]),
    )
    peak = current = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak


def max_starts_in_window(times: Sequence[datetime], period: timedelta) -> int:
    """The most of `times` in any half-open window `(t - period, t]`: what a rate limit of so
    many starts per `period` (a sliding window) must bound."""
    ordered = sorted(times)
    peak = first = 0
    for last, t in enumerate(ordered):
        while ordered[first] <= t - period:
            first += 1
        peak = max(peak, last - first + 1)
    return peak
