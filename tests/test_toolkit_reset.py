"""The per-test reset of the tables (`tests.toolkit.database.reset_tables`): a transaction left
open by an earlier test does not hang every later test; it is ended, and said. What it leaves is
what a truncate of every table leaves (`empty_tables`)."""

from __future__ import annotations

import asyncpg
import pytest

from jobq import db
from jobq.db import Connection, Database
from tests.conftest import TABLES
from tests.toolkit import database as toolkit


async def test_a_leaked_transaction_is_ended_and_reported(
    database: Database, conn: Connection
) -> None:
    leaked = await db.connect(database.direct_dsn)
    try:
        tx = leaked.transaction()
        await tx.start()
        await leaked.execute("SELECT count(*) FROM job")  # holds job's lock until it ends
        before = len(toolkit.reset_incidents)
        await toolkit.reset_tables(
            database.direct_dsn,
            ["TRUNCATE job", "INSERT INTO job_queue (name) VALUES ('from_the_reset')"],
            test="this test",
            lock_timeout="200ms",
        )
        assert leaked.is_closed() or await _terminated(leaked)
        incident = toolkit.reset_incidents.pop()
        assert len(toolkit.reset_incidents) == before
        assert "before this test: ended 1 sessions" in incident
        assert "SELECT count(*) FROM job" in incident
        assert await conn.fetchval("SELECT count(*) FROM job_queue WHERE name = 'from_the_reset'")
    finally:
        leaked.terminate()


async def _terminated(conn: Connection) -> bool:
    try:
        await conn.fetchval("SELECT 1")
    except Exception:
        return True
    return False


async def test_the_reset_leaves_every_table_as_fresh_as_a_truncate(
    database: Database, conn: Connection
) -> None:
    """Tables with rows (one of them in a partition), with only a deleted row, with more rows
    than `TRUNCATE_ABOVE_BYTES`, and with only a sequence that an insert refused by a constraint
    used: after the reset, each is empty, the large one's files too, and each next id is 1."""
    await conn.execute(
        "INSERT INTO users (name, email, created_at) VALUES ('a', 'a@example.com', now())"
    )
    await conn.execute(
        "INSERT INTO worker (host, pid, started_at, heartbeat_at) VALUES ('h', 1, now(), now())"
    )
    await conn.execute("DELETE FROM worker")
    await conn.execute(
        "INSERT INTO job_done (id, job_type, queue, arguments, state, attempts, created_at,"
        " finished_at) VALUES (1, 't', 'default', '{}', 'succeeded', 1, now(), now())"
    )
    await conn.execute(
        "INSERT INTO job (job_type, arguments, ripe_at, max_retries, created_at)"
        " SELECT 't', jsonb_build_object('n', n), now(), 0, now()"
        " FROM generate_series(1, 20000) AS n"
    )
    large = "SELECT pg_total_relation_size('job')"
    assert await conn.fetchval(large) > toolkit.TRUNCATE_ABOVE_BYTES
    with pytest.raises(asyncpg.NotNullViolationError):
        await conn.execute("INSERT INTO job (job_type) VALUES (NULL)")
    await toolkit.reset_tables(
        database.direct_dsn, [toolkit.empty_tables(TABLES)], test="this test"
    )
    for table in TABLES:
        assert await conn.fetchval(f"SELECT count(*) FROM {table}") == 0, table
    assert await conn.fetchval("SELECT pg_relation_size('job')") == 0
    ids = await conn.fetch(
        "SELECT pg_sequence_last_value(seqrelid) AS last FROM pg_sequence"
        " WHERE seqrelid::regclass::text IN ('users_id_seq', 'worker_id_seq', 'job_id_seq')"
    )
    assert [r["last"] for r in ids] == [None] * 3
