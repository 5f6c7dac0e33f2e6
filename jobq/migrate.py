"""The schema: numbered plain-SQL migrations from `sql/migrations/`, each applied once, then the
functions of `sql/functions/` re-created when they changed; all under an advisory lock
(sql/README.md)."""

from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path

from jobq import embedded, pooler
from jobq.config import PROJECT_ROOT, Settings
from jobq.db import Connection, adopt, session_dsn
from jobq.errors import JobqError

log = logging.getLogger(__name__)

SQL_DIR = PROJECT_ROOT / "sql"
MIGRATIONS_DIR = SQL_DIR / "migrations"
FUNCTIONS_DIR = SQL_DIR / "functions"
MIGRATION_LOCK = (1785684593, 0)
"""Advisory lock key (classid 'jobq', objid 0) held while migrating."""

BASELINE = "001_baseline.sql"
"""The first migration: the schema as it stood when the 18 earlier migrations were squashed."""

_NAME = re.compile(r"^(\d+)_[\w-]+\.sql$")


class PreBaselineDatabase(JobqError):
    """The database's `schema_migrations` names migrations from before the baseline."""

    def __init__(self) -> None:
        super().__init__(
            "this database was built by a jobq from before the baseline; recreate it"
            " (make db-stop && rm -rf .pgdata, or drop the database)"
        )


def migration_files(migrations_dir: Path = MIGRATIONS_DIR) -> list[tuple[int, Path]]:
    """Return `(version, path)` of every `NNN_name.sql` in `migrations_dir`, by version.

    Raises: `ValueError` when two files share a version.
    """
    found: dict[int, Path] = {}
    for path in sorted(migrations_dir.glob("*.sql")):
        match = _NAME.match(path.name)
        if match is None:
            continue
        version = int(match.group(1))
        if version in found:
            raise ValueError(f"two migrations numbered {version}: {found[version]}, {path}")
        found[version] = path
    return sorted(found.items())


def function_files(functions_dir: Path = FUNCTIONS_DIR) -> list[Path]:
    """Return every `<name>.sql` in `functions_dir`, by name."""
    return sorted(functions_dir.glob("*.sql"))


async def prepare(settings: Settings) -> str:
    """Resolve the DSN (starting the embedded server when `DATABASE_URL` is unset), check that
    the DSN of sessions (`JOBQ_DIRECT_DATABASE_URL` when set) is no transaction pooler
    (`jobq.pooler`), apply the migrations over it (the lock needs a session of its own), and
    return the DSN. Raises: `TransactionPooler` (nothing is migrated), `OSError` /
    `asyncpg.PostgresError` / `PreBaselineDatabase`."""
    dsn = await embedded.resolve_dsn(settings)
    conn = await session(settings, dsn)
    try:
        await migrate(conn)
    finally:
        await conn.close()
    return dsn


async def session(settings: Settings, dsn: str) -> Connection:
    """A connection of its own to the DSN of sessions of `dsn` (`session_dsn`): the probe's
    that found it no transaction pooler (`jobq.pooler`), with this process's codecs and
    `application_name` (`jobq.db.adopt`); it prepares no named statement. Raises:
    `TransactionPooler`, `OSError` / `asyncpg.PostgresError`."""
    conn = await pooler.own_session(session_dsn(settings, dsn))
    if conn is None:
        raise pooler.TransactionPooler(direct_set=settings.direct_database_url is not None)
    try:
        return await adopt(conn)
    except BaseException:
        await conn.close()
        raise


async def migrate(
    conn: Connection, migrations_dir: Path = MIGRATIONS_DIR, functions_dir: Path = FUNCTIONS_DIR
) -> list[int]:
    """Apply the migrations not yet recorded in `schema_migrations`, then re-create every
    function; return the versions applied.

    Two processes starting together are serialised by a session advisory lock; each
    migration runs in its own transaction with its record, and the functions in one more
    (`CREATE OR REPLACE`; bodies are checked when called, so their files need no order).
    As Flyway's repeatable migrations, the functions run only when their files' digest
    (recorded in `schema_functions`) changed, after a migration, or when a function of theirs
    is missing: a process that starts on an up-to-date database re-creates nothing, so it
    does not make every other session plan its statements again.

    Raises: `PreBaselineDatabase` when `schema_migrations` names a migration from before the
    baseline.
    """
    await conn.execute("SELECT pg_advisory_lock($1, $2)", *MIGRATION_LOCK)
    try:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version integer PRIMARY KEY,"
            " name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        await conn.execute("CREATE TABLE IF NOT EXISTS schema_functions (digest text NOT NULL)")
        recorded = await conn.fetch("SELECT version, name FROM schema_migrations")
        if any(r["version"] == 1 and r["name"] != BASELINE for r in recorded):
            raise PreBaselineDatabase()
        applied = {r["version"] for r in recorded}
        done = []
        for version, path in migration_files(migrations_dir):
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
        await _create_functions(conn, functions_dir, changed=bool(done))
        return done
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1, $2)", *MIGRATION_LOCK)


async def _create_functions(conn: Connection, functions_dir: Path, *, changed: bool) -> None:
    """Run every file of `functions_dir` in one transaction, and record their digest, unless
    (`changed` False) the recorded digest is theirs and each file's function exists."""
    files = function_files(functions_dir)
    texts = [path.read_text() for path in files]
    digest = hashlib.sha256(
        "".join(f"{path.name}\0{text}\0" for path, text in zip(files, texts, strict=True)).encode()
    ).hexdigest()
    names = [path.stem for path in files]
    current = await conn.fetchrow(
        "SELECT (SELECT digest FROM schema_functions) AS digest,"
        " (SELECT count(DISTINCT proname) FROM pg_proc"
        "  WHERE pronamespace = 'public'::regnamespace AND proname = ANY($1::text[])) AS present",
        names,
    )
    assert current is not None  # a SELECT of two values: one row
    if not changed and current["digest"] == digest and current["present"] == len(set(names)):
        return
    async with conn.transaction():
        await conn.execute("SET LOCAL check_function_bodies = off")
        for text in texts:
            await conn.execute(text)
        await conn.execute("DELETE FROM schema_functions")
        await conn.execute("INSERT INTO schema_functions (digest) VALUES ($1)", digest)
