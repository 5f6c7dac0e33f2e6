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
