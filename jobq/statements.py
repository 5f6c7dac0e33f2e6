"""Every SQL statement of jobq, each a named literal block of `sql/queries/*.sql`: the queue's
(`jobq.queue.sql` gives them to the engine) and the application's (users, reminders, exports,
API keys), loaded once, by one loader.

A block is in aiosql's format: `-- name: job_claim` (`!` after the name: it returns no rows),
then comment lines that say what it does, then the statement, with named parameters (`:now`,
`:worker_id`; `::type` is a cast). aiosql reads the files; `Query` numbers the names for asyncpg
(`$1`… in the order they first appear) and runs the statement on the caller's connection:
`statements.user_get.fetchrow(conn, user_id=7)`. Every time-based statement takes the time as
a parameter (the app clock); none uses `now()`. Names are noun first (`job_claim`,
`reminder_create`), so a table's statements sort together.

`python -m jobq sql` lists every statement's name; `python -m jobq sql NAME` prints one whole.

Why not aiosql's own query functions: its asyncpg adapter asks `dir()` of the connection at
every call to tell a pool from a connection (about 40 µs a call, measured against a direct
`fetchval`), and fixes one operation per name, where callers here choose `fetch`, `fetchrow`,
`fetchval` or `execute`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import aiosql
from aiosql.query_loader import _QUERY_DEF, QueryLoader
from aiosql.types import QueryDatum

from jobq.config import PROJECT_ROOT
from jobq.db import Connection

QUERIES_DIR = PROJECT_ROOT / "sql" / "queries"

_PARAMETER = re.compile(r"(?<![:\w]):([a-z_][a-z0-9_]*)")
_DOC = re.compile(r"^-- name: (?P<name>\w+)\W*\n(?P<doc>(?:--.*\n)*)", re.MULTILINE)


class Query:
    """A statement with named parameters (`:name`, never inside `::type` casts), sent with
    positional ones (`$1`...) in the order the names first appear in it."""

    def __init__(self, text: str, name: str = "", doc: str = "") -> None:
        names: list[str] = []

        def number(match: re.Match[str]) -> str:
            if match.group(1) not in names:
                names.append(match.group(1))
            return f"${names.index(match.group(1)) + 1}"

        self.name = name
        self.doc = doc
        self.source = text
        self.text = _PARAMETER.sub(number, text)
        self.params = tuple(names)

    def args(self, **values: Any) -> list[Any]:
        """The positional arguments for `values` (one per named parameter).
        Raises: `TypeError` when a parameter is missing or unknown."""
        if set(values) != set(self.params):
            missing, unknown = set(self.params) - set(values), set(values) - set(self.params)
            raise TypeError(f"parameters missing: {sorted(missing)}, unknown: {sorted(unknown)}")
        return [values[name] for name in self.params]

    async def fetch(self, conn: Connection, **values: Any) -> list[Any]:
        """Run it on `conn` and return its rows."""
        return await conn.fetch(self.text, *self.args(**values))

    async def fetchrow(self, conn: Connection, **values: Any) -> Any:
        """Run it on `conn` and return its first row, or None."""
        return await conn.fetchrow(self.text, *self.args(**values))

    async def fetchval(self, conn: Connection, **values: Any) -> Any:
        """Run it on `conn` and return the first column of its first row, or None."""
        return await conn.fetchval(self.text, *self.args(**values))

    async def execute(self, conn: Connection, **values: Any) -> str:
        """Run it on `conn` and return its status (`UPDATE 3`)."""
        return await conn.execute(self.text, *self.args(**values))


class _Verbatim:
    """An aiosql driver adapter that keeps each statement's text as written (`Query` numbers its
    parameters); aiosql only parses the files into named, documented blocks."""

    is_aio_driver = True

    def process_sql(self, _name: str, _op: Any, sql: str) -> str:
        return sql


class _Loader(QueryLoader):
    """aiosql's loader (its `loader_cls` extension point), without its search for `/* */`
    comments in a file that has none. aiosql 15 tokenizes the whole file for them with a pattern
    that also matches the empty string, so its loop runs at almost every character: about half
    of the load, which every process pays at its start. A file without `/*` is split into its
    named blocks exactly as aiosql splits it; one with `/*` takes aiosql's own path."""

    def load_query_data_from_sql(
        self, sql: str, ns_parts: list[str], fname: Path | str = "<unknown>"
    ) -> list[QueryDatum]:
        if "/*" in sql:
            return super().load_query_data_from_sql(sql, ns_parts, fname)
        blocks = _QUERY_DEF.split(sql)
        lineno = 1 + blocks[0].count("\n")
        data = []
        for block in blocks[1:]:  # the first: what comes before the first name
            data.append(self._make_query_datum(block, ns_parts, (fname, lineno)))
            lineno += block.count("\n")
        return data


def load(directory: Path = QUERIES_DIR) -> dict[str, Query]:
    """Every statement of the `*.sql` files in `directory`, by name.
    Raises: `aiosql.SQLParseException` on a malformed block or a name defined twice."""
    queries = aiosql.from_path(
        directory,
        _Verbatim,  # type: ignore[arg-type]  # only process_sql is used
        mandatory_parameters=False,
        loader_cls=_Loader,
    )
    docs = {  # the comment lines right below each name (aiosql's docs gather every comment)
        m["name"]: "\n".join(line.removeprefix("--").strip() for line in m["doc"].splitlines())
        for path in sorted(directory.glob("*.sql"))
        for m in _DOC.finditer(path.read_text())
    }
    return {
        name: Query(getattr(queries, name).sql.strip().rstrip(";"), name, docs.get(name, ""))
        for name in sorted(queries.available_queries)
        if name in docs
    }


STATEMENTS = load()
"""Every statement, by name."""


def __getattr__(name: str) -> Query:
    try:
        return STATEMENTS[name]
    except KeyError:
        raise AttributeError(f"no statement named {name!r} in {QUERIES_DIR}") from None
