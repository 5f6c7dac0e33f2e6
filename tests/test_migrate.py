"""Migrations: each applied once, recorded, and safe when processes start together."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from jobq import db
from jobq.migrate import SQL_DIR, migrate, migration_files
from tests.toolkit.database import fresh_database


def test_migration_files_are_numbered_in_order() -> None:
    versions = [version for version, _ in migration_files()]
    assert versions == sorted(versions)
    assert versions[:2] == [1, 2]


def test_two_files_with_one_number_are_an_error(tmp_path: Path) -> None:
    (tmp_path / "001_a.sql").write_text("SELECT 1;")
    (tmp_path / "001_b.sql").write_text("SELECT 1;")
    with pytest.raises(ValueError, match="two migrations numbered 1"):
        migration_files(tmp_path)


async def test_concurrent_migrations_apply_each_file_once(admin_dsn: str) -> None:
    async with fresh_database(admin_dsn, "jobq_migrate", migrated=False) as dsn:
        conns = [await db.connect(dsn) for _ in range(4)]
        try:
            applied = await asyncio.gather(*(migrate(c) for c in conns))
            expected = [version for version, _ in migration_files(SQL_DIR)]
            # exactly one process applied everything; the others found it done
            assert sorted(applied, key=len) == [[], [], [], expected]
            recorded = await conns[0].fetch("SELECT version FROM schema_migrations ORDER BY 1")
            assert [r["version"] for r in recorded] == expected
            assert await migrate(conns[0]) == []
            assert await conns[0].fetchval("SELECT to_regclass('job_running') IS NOT NULL")
        finally:
            for c in conns:
                await c.close()
