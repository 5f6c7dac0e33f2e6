"""A fresh database for one test session or one benchmark, on any PostgreSQL server."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator

import asyncpg

from jobq import db, embedded
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


def truncate_filled(tables: list[str]) -> str:
    """A statement that empties `tables` as `TRUNCATE <tables> RESTART IDENTITY CASCADE` does,
    but truncates only those whose files are not empty (`pg_relation_size` of the table or of
    its partitions: a table that held no row since its last truncate, not even a deleted or
    rolled-back one, is as fresh as a truncated one) and resets the sequences of the others to
    their start when they were used (an insert that a constraint refused). TRUNCATE makes new
    files for a table and each of its indexes, and waits for their fsync: a few tables instead
    of all of them make the reset before each test about 30 times cheaper."""
    names = ", ".join(f"'{table}'" for table in tables)
    return f"""
DO $reset$
DECLARE
    tables regclass[] := ARRAY[{names}]::regclass[];
    filled text;
BEGIN
    SELECT string_agg(t::text, ', ') INTO filled FROM unnest(tables) AS t
    WHERE pg_relation_size(t) > 0
       OR EXISTS (SELECT FROM pg_partition_tree(t) AS p WHERE pg_relation_size(p.relid) > 0);
    IF filled IS NOT NULL THEN
        EXECUTE 'TRUNCATE ' || filled || ' RESTART IDENTITY CASCADE';
    END IF;
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


async def reset_tables(
    dsn: str, statements: list[str], *, test: str, lock_timeout: str = RESET_LOCK_TIMEOUT
) -> None:
    """Run `statements` (TRUNCATE and the rows a fresh database has) in one transaction on a
    connection of its own to `dsn`, waiting at most `lock_timeout` for the locks. When
    that runs out, a session left over from an earlier test holds them (an open transaction):
    it is described in `reset_incidents`, ended, and the reset tried once more.
    Raises: `asyncpg.PostgresError` when the second try fails too."""
    conn = await db.connect(dsn)
    try:
        for last_try in (False, True):
            try:
                async with conn.transaction():
                    await conn.execute(f"SET LOCAL lock_timeout = '{lock_timeout}'")
                    for statement in statements:
                        await conn.execute(statement)
                return
            except asyncpg.LockNotAvailableError:
                if last_try:
                    raise
            blockers = await conn.fetch(_BLOCKERS)
            reset_incidents.append(
                f"before {test}: ended {len(blockers)} sessions holding the tables' locks: "
                + "; ".join(repr(dict(b)) for b in blockers)
            )
            for blocker in blockers:
                await conn.execute("SELECT pg_terminate_backend($1, 5000)", blocker["pid"])
    finally:
        await conn.close()
