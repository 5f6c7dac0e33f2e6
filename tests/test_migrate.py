"""Migrations: each applied once, recorded, and safe when processes start together; the schema
they build is `sql/schema.sql` plus `sql/functions/`, each function defined once."""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from pathlib import Path

import pytest

from jobq import db
from jobq.db import Connection
from jobq.migrate import (
    BASELINE,
    SQL_DIR,
    PreBaselineDatabase,
    function_files,
    migrate,
    migration_files,
)
from tests.toolkit.database import fresh_database

SNAPSHOT = """
WITH rel AS (
    SELECT c.oid, c.relname, c.relkind FROM pg_class AS c
    WHERE c.relnamespace = 'public'::regnamespace
      AND c.relname NOT IN ('schema_migrations', 'schema_migrations_pkey', 'schema_functions')
      AND NOT EXISTS (SELECT FROM pg_depend AS d WHERE d.classid = 'pg_class'::regclass
                      AND d.objid = c.oid AND d.deptype = 'e')
), fn AS (
    SELECT p.oid FROM pg_proc AS p
    WHERE p.pronamespace = 'public'::regnamespace
      AND NOT EXISTS (SELECT FROM pg_depend AS d WHERE d.classid = 'pg_proc'::regclass
                      AND d.objid = p.oid AND d.deptype = 'e')
)
SELECT 'relation', concat_ws(' | ', r.relname, r.relkind, c.reloptions::text,
                            pg_get_partkeydef(r.oid), pg_get_expr(c.relpartbound, r.oid))
FROM rel AS r JOIN pg_class AS c ON c.oid = r.oid
UNION ALL
SELECT 'column', concat_ws(' | ', r.relname,
    row_number() OVER (PARTITION BY r.oid ORDER BY a.attnum), a.attname,
    format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attgenerated, a.attidentity,
    pg_get_expr(ad.adbin, ad.adrelid))
FROM rel AS r JOIN pg_attribute AS a ON a.attrelid = r.oid AND a.attnum > 0
                                        AND NOT a.attisdropped
LEFT JOIN pg_attrdef AS ad ON ad.adrelid = r.oid AND ad.adnum = a.attnum
WHERE r.relkind IN ('r', 'p', 'v', 'm', 'f')
UNION ALL
SELECT 'constraint', concat_ws(' | ', coalesce(r.relname, t.typname), co.conname,
                              pg_get_constraintdef(co.oid))
FROM pg_constraint AS co
LEFT JOIN rel AS r ON r.oid = co.conrelid
LEFT JOIN pg_type AS t ON t.oid = co.contypid
WHERE co.connamespace = 'public'::regnamespace AND (co.conrelid = 0 OR r.oid IS NOT NULL)
UNION ALL
SELECT 'index', pg_get_indexdef(i.indexrelid)
FROM pg_index AS i JOIN rel AS r ON r.oid = i.indrelid
UNION ALL
SELECT 'view', concat_ws(' | ', r.relname, pg_get_viewdef(r.oid))
FROM rel AS r WHERE r.relkind IN ('v', 'm')
UNION ALL
SELECT 'trigger', pg_get_triggerdef(tg.oid)
FROM pg_trigger AS tg JOIN rel AS r ON r.oid = tg.tgrelid WHERE NOT tg.tgisinternal
UNION ALL
SELECT 'sequence', concat_ws(' | ', s.sequencename, s.data_type, s.start_value, s.min_value,
                            s.max_value, s.increment_by, s.cycle, s.cache_size)
FROM pg_sequences AS s WHERE s.schemaname = 'public'
UNION ALL
SELECT 'type', concat_ws(' | ', t.typname, t.typtype,
    (SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder) FROM pg_enum AS e
     WHERE e.enumtypid = t.oid))
FROM pg_type AS t
WHERE t.typnamespace = 'public'::regnamespace
  AND t.typname NOT LIKE '%schema_migrations' AND t.typname NOT LIKE '%schema_functions'
UNION ALL
SELECT 'comment', concat_ws(' | ', pg_describe_object(d.classoid, d.objoid, d.objsubid),
                           d.description)
FROM pg_description AS d
WHERE d.objoid IN (SELECT oid FROM rel UNION ALL SELECT oid FROM fn)
UNION ALL
SELECT 'function', pg_get_functiondef(f.oid) FROM fn AS f
ORDER BY 1, 2
"""
"""The catalog of the `public` schema as rows of text (the bookkeeping of `migrate`,
`schema_migrations` and `schema_functions`, left out): what a
step-by-step migration and `sql/schema.sql` must build alike."""


async def snapshot(conn: Connection) -> list[tuple[str, str]]:
    """The catalog rows of `SNAPSHOT`, in order."""
    return [(r[0], r[1]) for r in await conn.fetch(SNAPSHOT)]


async def create_functions(conn: Connection) -> None:
    """Create every function of `sql/functions/` (bodies checked when called, as migrate does)."""
    async with conn.transaction():
        await conn.execute("SET LOCAL check_function_bodies = off")
        for path in function_files():
            await conn.execute(path.read_text())


def test_migration_files_are_numbered_in_order_from_the_baseline() -> None:
    files = migration_files()
    versions = [version for version, _ in files]
    assert versions == sorted(versions)
    assert files[0] == (1, SQL_DIR / "migrations" / BASELINE)


def test_two_files_with_one_number_are_an_error(tmp_path: Path) -> None:
    (tmp_path / "001_a.sql").write_text("SELECT 1;")
    (tmp_path / "001_b.sql").write_text("SELECT 1;")
    with pytest.raises(ValueError, match="two migrations numbered 1"):
        migration_files(tmp_path)


def test_each_function_is_defined_once_under_sql_in_its_own_file() -> None:
    create = re.compile(r"\bCREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+(?:public\.)?(\w+)", re.I)
    defined = Counter(
        (name.lower(), path.relative_to(SQL_DIR).as_posix())
        for path in SQL_DIR.rglob("*.sql")
        for name in create.findall(path.read_text())
    )
    names = Counter(name for name, _ in defined.elements())
    assert {name for name, count in names.items() if count != 1} == set()
    assert sorted(defined) == sorted(
        (path.stem, f"functions/{path.name}") for path in function_files()
    )


async def test_concurrent_migrations_apply_each_file_once(admin_dsn: str) -> None:
    async with fresh_database(admin_dsn, "jobq_migrate", migrated=False) as dsn:
        conns = [await db.connect(dsn) for _ in range(4)]
        try:
            applied = await asyncio.gather(*(migrate(c) for c in conns))
            expected = [version for version, _ in migration_files()]
            # exactly one process applied everything; the others found it done
            assert sorted(applied, key=len) == [[], [], [], expected]
            recorded = await conns[0].fetch("SELECT version FROM schema_migrations ORDER BY 1")
            assert [r["version"] for r in recorded] == expected
            assert await migrate(conns[0]) == []
            assert await conns[0].fetchval("SELECT to_regclass('job_running') IS NOT NULL")
        finally:
            for c in conns:
                await c.close()


async def test_migrated_step_by_step_equals_schema_sql_with_the_functions(admin_dsn: str) -> None:
    async with (
        fresh_database(admin_dsn, "jobq_steps") as stepped_dsn,
        fresh_database(admin_dsn, "jobq_whole", migrated=False) as whole_dsn,
    ):
        stepped = await db.connect(stepped_dsn)
        whole = await db.connect(whole_dsn)
        try:
            async with whole.transaction():
                await whole.execute((SQL_DIR / "schema.sql").read_text())
            await create_functions(whole)
            built = await snapshot(whole)
            assert {kind for kind, _ in built} >= {
                "relation", "column", "constraint", "index", "view", "sequence", "type",
                "comment", "function",
            }  # fmt: skip
            assert await snapshot(stepped) == built
            # the comparison sees a column that one of them lacks
            await whole.execute("ALTER TABLE job_rate ADD COLUMN spare integer")
            assert await snapshot(stepped) != await snapshot(whole)
        finally:
            await stepped.close()
            await whole.close()


async def test_every_function_in_a_migrated_database_comes_from_sql_functions(
    admin_dsn: str,
) -> None:
    async with fresh_database(admin_dsn, "jobq_functions") as dsn:
        conn = await db.connect(dsn)
        try:
            names = await conn.fetch(
                "SELECT proname FROM pg_proc WHERE pronamespace = 'public'::regnamespace"
            )
        finally:
            await conn.close()
    assert sorted(r["proname"] for r in names) == sorted(p.stem for p in function_files())


async def written(conn: Connection) -> dict[str, str]:
    """Each function, with the transaction that last wrote its row (a new one at each
    re-creation)."""
    rows = await conn.fetch(
        "SELECT proname, xmin::text FROM pg_proc WHERE pronamespace = 'public'::regnamespace"
    )
    return {r["proname"]: r["xmin"] for r in rows}


async def test_functions_are_re_created_only_when_changed_or_missing(
    admin_dsn: str, tmp_path: Path
) -> None:
    async with fresh_database(admin_dsn, "jobq_repeat") as dsn:
        conn = await db.connect(dsn)
        try:
            first = await written(conn)
            assert await migrate(conn) == []
            assert await written(conn) == first  # up to date: none re-created
            # a file changed: every function runs again, in one transaction
            changed = tmp_path / "functions"
            changed.mkdir()
            for path in function_files():
                changed.joinpath(path.name).write_text(path.read_text())
            text = changed.joinpath("job_is_active.sql").read_text()
            changed.joinpath("job_is_active.sql").write_text(text + "\n-- changed\n")
            await migrate(conn, functions_dir=changed)
            second = await written(conn)
            assert second.keys() == first.keys()
            assert all(second[name] != first[name] for name in first)
            assert await migrate(conn, functions_dir=changed) == []
            assert await written(conn) == second
            # a function dropped by hand is made again at the next migrate
            await conn.execute("DROP FUNCTION job_is_active")
            await migrate(conn, functions_dir=changed)
            assert (await written(conn)).keys() == first.keys()
        finally:
            await conn.close()


async def test_a_database_from_before_the_baseline_is_refused(admin_dsn: str) -> None:
    async with fresh_database(admin_dsn, "jobq_old", migrated=False) as dsn:
        conn = await db.connect(dsn)
        try:
            await conn.execute(
                "CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now());"
                " INSERT INTO schema_migrations (version, name)"
                " VALUES (1, '001_queue.sql'), (18, '018_limits_grants.sql')"
            )
            with pytest.raises(PreBaselineDatabase, match="recreate it"):
                await migrate(conn)
            assert await conn.fetchval("SELECT to_regclass('job') IS NULL")
        finally:
            await conn.close()
