"""A fresh database for one test session or one benchmark, on any PostgreSQL server."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator

import asyncpg

from jobq import db, embedded
from jobq.db import Connection
from jobq.migrate import migrate


@contextlib.asynccontextmanager
async def fresh_database(
    admin_dsn: str, prefix: str, *, migrated: bool = True
) -> AsyncIterator[str]:
    """Create a database `<prefix>_<pid>_<6 hex digits>` on the server of `admin_dsn` (a DSN to
    any database there), apply jobq's migrations unless `migrated` is False, and yield its DSN;
    drop it at the end (`WITH (FORCE)`: sessions still open are ended)."""
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    dsn = embedded.with_database(admin_dsn, name)
    try:
        if migrated:
            conn = await db.connect(dsn)
            try:
                await migrate(conn)
            finally:
                await conn.close()
        yield dsn
    finally:
        admin = await asyncpg.connect(admin_dsn)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


TRUNCATE_ABOVE_BYTES = 1 << 20
"""A table whose files (with its partitions and indexes) are larger is truncated by the reset;
the others are emptied by DELETE."""


def empty_tables(tables: list[str]) -> str:
    """A statement that empties `tables` and restarts their sequences, as `TRUNCATE <tables>
    RESTART IDENTITY CASCADE` does, at the cost of the few rows a test leaves.

    Only a table larger than `TRUNCATE_ABOVE_BYTES` is truncated; the others are emptied by
    DELETE. A TRUNCATE makes new files for the table and each of its indexes, and invalidates
    every session's cached plans of the table (the next statement of each pool connection plans
    again); a DELETE of a few rows does neither. The rows it leaves dead are autovacuum's, and a
    table that they grow past the bound is truncated at a later reset. Every foreign key of the
    schema cascades, so the DELETEs' order does not matter; they run under the lock a TRUNCATE
    takes. The sequences that were used (by
    an insert, or by one a constraint refused) are set back to their start."""
    names = ", ".join(f"'{table}'" for table in tables)
    return f"""
DO $reset$
DECLARE
    tables regclass[] := ARRAY[{names}]::regclass[];
    t      regclass;
BEGIN
    -- as a TRUNCATE would: wait for every transaction that still uses them (`reset_tables`
    -- ends one that waits too long)
    EXECUTE 'LOCK TABLE ' || array_to_string(tables, ', ') || ' IN ACCESS EXCLUSIVE MODE';
    FOR t IN SELECT u.t FROM unnest(tables) AS u(t)  -- those that held a row since emptied
             WHERE pg_relation_size(u.t) > 0 OR EXISTS (
                 SELECT FROM pg_partition_tree(u.t) AS p WHERE pg_relation_size(p.relid) > 0)
    LOOP
        IF pg_total_relation_size(t) + coalesce(  -- a partitioned table's: its partitions'
               (SELECT sum(pg_total_relation_size(p.relid)) FROM pg_partition_tree(t) AS p), 0)
           > {TRUNCATE_ABOVE_BYTES}
        THEN
            EXECUTE 'TRUNCATE ' || t || ' CASCADE';
        ELSE
            EXECUTE 'DELETE FROM ' || t;
        END IF;
    END LOOP;
    PERFORM setval(s.seqrelid, s.seqstart, false)
    FROM pg_sequence AS s
    JOIN pg_depend AS d ON d.classid = 'pg_class'::regclass AND d.objid = s.seqrelid
    WHERE d.deptype IN ('a', 'i') AND d.refobjid = ANY (tables)
      AND pg_sequence_last_value(s.seqrelid) IS NOT NULL;
END
$reset$"""


RESET_LOCK_TIMEOUT = "10s"
"""How long a reset waits for the tables' locks before it looks for what holds them."""

_BLOCKERS = """
SELECT DISTINCT a.pid, a.state, a.application_name, now() - a.xact_start AS xact_age,
       left(a.query, 300) AS query
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.granted AND a.pid <> pg_backend_pid() AND a.backend_type = 'client backend'
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.relation IN (SELECT oid FROM pg_class WHERE relnamespace = 'public'::regnamespace)
"""

reset_incidents: list[str] = []
"""What `reset_tables` had to end to get its locks: printed at the end of the test session
(`tests/conftest.py`), so that a test that leaks a transaction is seen, not hidden."""


_reset_connections: dict[str, Connection] = {}
"""The connection of each DSN's resets, kept open across tests (`close_reset_connections`)."""


async def reset_tables(
    dsn: str, statements: list[str], *, test: str, lock_timeout: str = RESET_LOCK_TIMEOUT
) -> None:
    """Run `statements` (the emptying of the tables and the rows a fresh database has) in one
    transaction on a connection of the resets' own to `dsn` (kept open for the next reset;
    opened again when a test ended it), waiting at most `lock_timeout` for the locks. When
    that runs out, or the reset deadlocks with one, a session left over from an earlier test
    holds them (an open transaction): it is described in `reset_incidents`, ended, and the
    reset tried once more.
    Raises: `asyncpg.PostgresError` when the second try fails too."""
    conn = _reset_connections.get(dsn)
    if conn is None or conn.is_closed() or not await _alive(conn):
        conn = _reset_connections[dsn] = await db.connect(dsn)
    for last_try in (False, True):
        try:
            async with conn.transaction():
                await conn.execute(f"SET LOCAL lock_timeout = '{lock_timeout}'")
                for statement in statements:
                    await conn.execute(statement)
            return
        except (asyncpg.LockNotAvailableError, asyncpg.DeadlockDetectedError) as exc:
            # a deadlock: a session left over from an earlier test still writes (a job that
            # outlived its worker's test) and waits for a table the reset has locked
            if last_try:
                raise
            why = type(exc).__name__
        blockers = await conn.fetch(_BLOCKERS)
        reset_incidents.append(
            f"before {test}: ended {len(blockers)} sessions holding the tables' locks ({why}): "
            + "; ".join(repr(dict(b)) for b in blockers)
        )
        for blocker in blockers:
            await conn.execute("SELECT pg_terminate_backend($1, 5000)", blocker["pid"])


async def _alive(conn: Connection) -> bool:
    """Whether `conn`'s server session still lives (a test may have ended every session)."""
    try:
        await conn.execute("SELECT 1")
    except (asyncpg.PostgresConnectionError, asyncpg.InterfaceError, OSError):
        conn.terminate()
        return False
    return True


async def close_reset_connections() -> None:
    """Close the connections `reset_tables` kept open."""
    while _reset_connections:
        _, conn = _reset_connections.popitem()
        if not conn.is_closed():
            await conn.close()
