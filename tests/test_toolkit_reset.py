"""The per-test reset of the tables (`tests.toolkit.database.reset_tables`): a transaction left
open by an earlier test does not hang every later test; it is ended, and said. What it leaves is
what a truncate of every table leaves (`truncate_filled`)."""

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
    """Tables with rows (one of them in a partition), with only a deleted row, and with only a
    sequence that an insert refused by a constraint used: after the reset, each is empty, its
    files too, and its next id is 1 again."""
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
    with pytest.raises(asyncpg.NotNullViolationError):
        await conn.execute("INSERT INTO job (job_type) VALUES (NULL)")
    await toolkit.reset_tables(
        database.direct_dsn, [toolkit.truncate_filled(TABLES)], test="this test"
    )
    for table in TABLES:  # a partitioned table's rows are in its partitions
        size = "SELECT sum(pg_relation_size(relid)) FROM pg_partition_tree($1)"
        assert await conn.fetchval(size, table) in (0, None), table
        assert await conn.fetchval("SELECT pg_relation_size($1)", table) == 0, table
    ids = await conn.fetch(
        "SELECT pg_sequence_last_value(seqrelid) AS last FROM pg_sequence"
        " WHERE seqrelid::regclass::text IN ('users_id_seq', 'worker_id_seq', 'job_id_seq')"
    )
    assert [r["last"] for r in ids] == [None] * 3
