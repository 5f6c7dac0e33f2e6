"""Recording one outcome at a time, as tests do: thin wrappers over `store.record`, which takes
a batch of `Outcome`s (the engine never records one at a time)."""

from __future__ import annotations

from datetime import datetime

from jobq import clock
from jobq.db import Connection
from jobq.queue import store
from jobq.queue.model import Outcome, Verdict


async def complete(conn: Connection, tokens: list[int]) -> int:
    """Record the success of the jobs claimed with `tokens`; return how many were still held."""
    outcomes = [Outcome(token, Verdict.COMPLETE) for token in tokens]
    return len(await store.record(conn, outcomes, now=clock.now()))


async def retry(
    conn: Connection, token: int, *, ripe_at: datetime, error: str, now: datetime
) -> bool:
    """Record a failed attempt (back to the queue at `ripe_at`); False for a stale token."""
    return bool(await store.record(conn, [Outcome(token, Verdict.RETRY, ripe_at, error)], now=now))


async def release(conn: Connection, token: int, *, now: datetime) -> bool:
    """Put a claimed job back, no attempt charged; False for a stale token."""
    return bool(await store.record(conn, [Outcome(token, Verdict.RELEASE, now)], now=now))


async def bury(conn: Connection, token: int, *, now: datetime, error: str) -> bool:
    """Move a claimed job to the dead letter; False for a stale token."""
    return bool(await store.record(conn, [Outcome(token, Verdict.BURY, error=error)], now=now))
