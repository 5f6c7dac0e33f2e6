"""The embedded PostgreSQL server used when no `DATABASE_URL` is set.

It is a real server (the binaries ship in the `pgserver` wheel) with its data in
`Settings.pgdata_dir`, listening on a Unix socket inside that folder only. It is left running
for the next start; `python -m jobq db-stop` (`make db-stop`) stops it. As root, pgserver runs
the server as a system user of its own (`pgserver`), since PostgreSQL refuses to run as root.

`programs()` is the one way to run the wheel's programs (initdb, pg_ctl, postgres) as the right
user; the test and benchmark toolkit (`tests/toolkit/postgres.py`) starts its own servers with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import re
import stat
import subprocess
import warnings
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from jobq.config import Settings

log = logging.getLogger(__name__)

DATABASE_NAME = "jobq"

SYSTEM_USER = "pgserver"
"""The system user the server runs as when we are root (pgserver's own, created if needed)."""


def _import_pgserver() -> None:
    with warnings.catch_warnings():
        # platformdirs warns that XDG_RUNTIME_DIR is unset and falls back to /tmp: harmless
        warnings.simplefilter("ignore", UserWarning)
        import pgserver  # noqa: F401 (imported here: only needed when there is no DATABASE_URL)


def programs() -> tuple[Path, str | None]:
    """Return the folder of the wheel's PostgreSQL programs and the user to run them as: None
    (this process's user), or as root `SYSTEM_USER`, since PostgreSQL refuses to run as root.

    As root this first does what `pgserver.get_server` does before it runs them: it creates the
    user if needed and lets it reach the programs and their libraries (adding o+rx to the folders
    above them, as pgserver does), so that a server started this way runs wherever the embedded
    one does, even from a checkout in a folder only root may enter (mode 700, or /root).
    Raises: `subprocess.CalledProcessError` when `useradd` fails.
    """
    _import_pgserver()
    from pgserver._commands import POSTGRES_BIN_PATH

    bin_path: Path = POSTGRES_BIN_PATH
    if os.geteuid() != 0:
        return bin_path, None
    from pgserver.utils import (
        ensure_folder_permissions,
        ensure_prefix_permissions,
        ensure_user_exists,
    )

    ensure_user_exists(SYSTEM_USER)
    ensure_prefix_permissions(bin_path)
    read = stat.S_IRGRP | stat.S_IROTH
    ensure_folder_permissions(bin_path, read | stat.S_IXGRP | stat.S_IXOTH)
    ensure_folder_permissions(bin_path.parent / "lib", read)
    return bin_path, SYSTEM_USER


MAX_CONNECTIONS = 300
"""The embedded server's `max_connections`: PostgreSQL's default, 100, is less than what the
processes of `make test` (its parallel workers, and the worker processes their tests start) or
a fleet of `make run` workers can open at once."""
_SET_MAX_CONNECTIONS = f"ALTER SYSTEM SET max_connections = {MAX_CONNECTIONS}"


def start(pgdata_dir: Path) -> str:
    """Start the embedded server in `pgdata_dir` unless it runs already; return its admin DSN.

    A server with fewer than `MAX_CONNECTIONS` is given that many and restarted (once: the
    setting stays in its folder). Processes that start it at once (the test runner's workers,
    `make run` beside `make test`) take turns on an exclusive lock of the file
    `<pgdata_dir>.lock`: pgserver creates the folder and its system user before its own lock,
    where the second of two processes can fail.
    The DSN names the `postgres` database; `with_database()` swaps in another.
    Raises: `subprocess.CalledProcessError` when initdb, pg_ctl or psql fail (the server's log
    is in the folder).
    """
    _import_pgserver()
    import pgserver

    pgdata_dir.parent.mkdir(parents=True, exist_ok=True)
    with pgdata_dir.with_name(pgdata_dir.name + ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        server = pgserver.get_server(pgdata_dir, cleanup_mode=None)  # type: ignore[attr-defined]
        dsn: str = server.get_uri("postgres")
        if int(_psql(dsn, "SHOW max_connections")) < MAX_CONNECTIONS:
            _psql(dsn, _SET_MAX_CONNECTIONS)
            _pg_ctl(pgdata_dir, "-w", "-l", str(pgdata_dir / "log"), "restart", "-m", "fast")
    log.info("embedded PostgreSQL in %s", pgdata_dir)
    return dsn


def _psql(dsn: str, statement: str) -> str:
    """Run one statement with the wheel's psql; return its output, unaligned, tuples only."""
    bin_path, _ = programs()
    done = subprocess.run(  # noqa: S603 (the wheel's own psql, our arguments)
        [str(bin_path / "psql"), dsn, "-X", "-A", "-t", "-c", statement],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def _pg_ctl(pgdata_dir: Path, *args: str) -> None:
    """Run the wheel's pg_ctl on `pgdata_dir` as the folder's owner."""
    from pgserver._commands import pg_ctl  # type: ignore[attr-defined]

    owner = pgdata_dir.owner()
    pg_ctl(list(args), pgdata=pgdata_dir, user=None if owner == _whoami() else owner)


def stop(pgdata_dir: Path) -> bool:
    """Stop the embedded server in `pgdata_dir`. Return False when it was not running."""
    if not (pgdata_dir / "postmaster.pid").exists():
        return False
    _import_pgserver()
    try:
        _pg_ctl(pgdata_dir, "-w", "stop", "-m", "fast")
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
