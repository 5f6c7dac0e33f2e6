"""The embedded PostgreSQL server used when no `DATABASE_URL` is set.

It is a real server (the binaries ship in the `pgserver` wheel) with its data in
`Settings.pgdata_dir`, listening on a Unix socket inside that folder only. It is left running
for the next start; `python -m jobq db-stop` (`make db-stop`) stops it. As root, pgserver runs
the server as a system user of its own (`pgserver`), since PostgreSQL refuses to run as root.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import subprocess
import warnings
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from jobq.config import Settings

log = logging.getLogger(__name__)

DATABASE_NAME = "jobq"


def start(pgdata_dir: Path) -> str:
    """Start the embedded server in `pgdata_dir` unless it runs already; return its admin DSN.

    The DSN names the `postgres` database; `with_database()` swaps in another.
    Raises: `subprocess.CalledProcessError` when initdb or pg_ctl fail (their log is in the folder).
    """
    with warnings.catch_warnings():
        # platformdirs warns that XDG_RUNTIME_DIR is unset and falls back to /tmp: harmless
        warnings.simplefilter("ignore", UserWarning)
        import pgserver  # imported here: it is only needed when there is no DATABASE_URL

    pgdata_dir.parent.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(pgdata_dir, cleanup_mode=None)  # type: ignore[attr-defined]
    dsn: str = server.get_uri("postgres")
    log.info("embedded PostgreSQL in %s", pgdata_dir)
    return dsn


def stop(pgdata_dir: Path) -> bool:
    """Stop the embedded server in `pgdata_dir`. Return False when it was not running."""
    if not (pgdata_dir / "postmaster.pid").exists():
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # see start()
        from pgserver._commands import pg_ctl  # type: ignore[attr-defined]

    owner = pgdata_dir.owner()
    user = None if owner == _whoami() else owner
    try:
        pg_ctl(["-w", "stop", "-m", "fast"], pgdata=pgdata_dir, user=user)
    except subprocess.CalledProcessError:
        return False
    return True


def _whoami() -> str:
    import getpass

    return getpass.getuser()


def with_database(dsn: str, database: str) -> str:
    """Return `dsn` with its database name replaced by `database`."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path="/" + database))


async def resolve_dsn(settings: Settings) -> str:
    """Return `settings.database_url`, or start the embedded server (in a thread: initdb can
    take seconds), create its `jobq` database if needed, and return that database's DSN."""
    if settings.database_url is not None:
        return settings.database_url.get_secret_value()
    admin = await asyncio.to_thread(start, settings.pgdata_dir)
    await ensure_database(admin, DATABASE_NAME)
    return with_database(admin, DATABASE_NAME)


async def ensure_database(admin_dsn: str, database: str) -> None:
    """Create `database` on the server of `admin_dsn` unless it exists.

    Raises: `ValueError` for a name that is not a plain lower-case identifier.
    """
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", database):
        raise ValueError(f"not a plain database name: {database!r}")
    conn = await asyncpg.connect(admin_dsn)
    try:
        exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", database)
        if not exists:
            # another process may create it meanwhile
            with contextlib.suppress(asyncpg.DuplicateDatabaseError, asyncpg.UniqueViolationError):
                await conn.execute(f'CREATE DATABASE "{database}"')
    finally:
        await conn.close()
