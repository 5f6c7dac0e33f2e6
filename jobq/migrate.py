"""Numbered plain-SQL migrations from `sql/`, each applied once, under an advisory lock."""

from __future__ import annotations

import logging
import re
from pathlib import Path

from jobq import embedded
from jobq.config import PROJECT_ROOT, Settings
from jobq.db import Connection, connect, session_dsn

log = logging.getLogger(__name__)

SQL_DIR = PROJECT_ROOT / "sql"
MIGRATION_LOCK = (1785684593, 0)
"""Advisory lock key (classid 'jobq', objid 0) held while migrating."""

_NAME = re.compile(r"^(\d+)_[\w-]+\.sql$")


def migration_files(sql_dir: Path = SQL_DIR) -> list[tuple[int, Path]]:
    """Return `(version, path)` of every `NNN_name.sql` in `sql_dir`, by version.

    Raises: `ValueError` when two files share a version.
    """
    found: dict[int, Path] = {}
    for path in sorted(sql_dir.glob("*.sql")):
        match = _NAME.match(path.name)
        if match is None:
            continue
        version = int(match.group(1))
        if version in found:
            raise ValueError(f"two migrations numbered {version}: {found[version]}, {path}")
        found[version] = path
    return sorted(found.items())


async def prepare(settings: Settings) -> str:
    """Resolve the DSN (starting the embedded server when `DATABASE_URL` is unset), apply the
    migrations (over `JOBQ_DIRECT_DATABASE_URL` when set: the lock needs a session of its own),
    and return the DSN. Raises: `OSError` / `asyncpg.PostgresError`."""
    dsn = await embedded.resolve_dsn(settings)
    conn = await connect(session_dsn(settings, dsn))
    try:
        await migrate(conn)
    finally:
        await conn.close()
    return dsn


async def migrate(conn: Connection, sql_dir: Path = SQL_DIR) -> list[int]:
    """Apply the migrations not yet recorded in `schema_migrations`; return their versions.

    Two processes starting together are serialised by a session advisory lock; each
    migration runs in its own transaction with its record.
    """
    await conn.execute("SELECT pg_advisory_lock($1, $2)", *MIGRATION_LOCK)
    try:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version integer PRIMARY KEY,"
            " name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        applied = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
        done = []
        for version, path in migration_files(sql_dir):
            if version in applied:
                continue
            async with conn.transaction():
                await conn.execute(path.read_text())
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                    version,
                    path.name,
                )
            log.info("applied migration %s", path.name)
            done.append(version)
        return done
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1, $2)", *MIGRATION_LOCK)
