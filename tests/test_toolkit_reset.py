"""The per-test reset of the tables (`tests.toolkit.database.reset_tables`): a transaction left
open by an earlier test does not hang every later test; it is ended, and said."""

from __future__ import annotations

from jobq import db
from jobq.db import Connection, Database
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
