"""The pool's lifecycle, the connection of the current transaction, and the transaction decorators.

One mechanism everywhere: the `Database` in use is held by a ContextVar (bound by the app for
each request and by the worker for each job), and the transaction in progress by another.
`transaction()` opens one on a pooled connection, or joins the one in progress with a savepoint;
`write_transaction` and `read_transaction` wrap a coroutine (a Quart view or any other) in it.
"""

from __future__ import annotations

import functools
import json
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import asyncpg

from jobq.config import Settings

P = ParamSpec("P")
T = TypeVar("T")

if TYPE_CHECKING:  # generic only in asyncpg-stubs
    from asyncpg.pool import PoolConnectionProxy

    Connection = asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record]
    Pool = asyncpg.Pool[asyncpg.Record]
else:
    Connection = asyncpg.Connection
    Pool = asyncpg.Pool


async def _init_connection(conn: Connection) -> None:
    """Decode json/jsonb to Python objects on every pooled connection."""
    for typename in ("json", "jsonb"):
        await conn.set_type_codec(
            typename, schema="pg_catalog", encoder=json.dumps, decoder=json.loads
        )


def application_name() -> str:
    """`jobq/<pid>@<host>`: the `application_name` of every session of this process, so that
    other workers can tell from `pg_stat_activity` whether it lives (`sql.APPLICATION_NAME`)."""
    return f"jobq/{os.getpid()}@{socket.gethostname()}"[:63]


async def connect(
    dsn: str, *, server_settings: dict[str, str] | None = None, command_timeout: float | None = None
) -> asyncpg.Connection[asyncpg.Record]:
    """Open one connection outside the pool (listener, migrations, tests), with the same codecs
    and `application_name`, plus `server_settings`; `command_timeout` is in seconds."""
    conn: asyncpg.Connection[asyncpg.Record] = await asyncpg.connect(
        dsn,
        server_settings={"application_name": application_name(), **(server_settings or {})},
        command_timeout=command_timeout,
    )
    await _init_connection(conn)
    return conn


async def adopt(conn: Connection) -> Connection:
    """Give a connection opened elsewhere (`jobq.pooler.own_session`) what `connect()` gives
    one: the codecs and this process's `application_name` (set, not a startup parameter)."""
    await conn.execute("SELECT set_config('application_name', $1, false)", application_name())
    await _init_connection(conn)
    return conn


def session_dsn(settings: Settings, dsn: str) -> str:
    """The DSN of connections that need a session of their own: `JOBQ_DIRECT_DATABASE_URL`
    when set (the server itself, when `dsn` is a pooler), else `dsn`."""
    direct = settings.direct_database_url
    return dsn if direct is None else direct.get_secret_value()


async def _keep_session(conn: Connection) -> None:
    """Return a connection to the pool without asyncpg's reset query (`RESET ALL`,
    `UNLISTEN *`, `pg_advisory_unlock_all()`, `CLOSE ALL`): one round trip less per use.

    asyncpg still rolls back a transaction left open and drops listeners. Session state set on
    a pooled connection (a plain `SET`, a session advisory lock, `LISTEN`) would outlive its
    use, as behind PgBouncer's transaction pooling: use `SET LOCAL` and transaction-level locks,
    and `connect()` for a connection of one's own.
    """


class Database:
    """An asyncpg pool, its DSN, and the DSN of sessions of one's own (`direct_dsn`). Create with
    `Database.open(settings, dsn)`; close it last."""

    def __init__(self, pool: Pool, dsn: str, direct_dsn: str | None = None) -> None:
        self.pool = pool
        self.dsn = dsn
        self.direct_dsn = direct_dsn or dsn
        """Where connections that need a session go (`connect()`): the worker's listener."""
        self.before_close: list[Callable[[], Awaitable[None]]] = []
        """Awaited by `close()` before the pool closes (e.g. sending pending notifications)."""

    @property
    def pooled(self) -> bool:
        """True when the pool goes through a pooler (`direct_dsn` differs from `dsn`)."""
        return self.direct_dsn != self.dsn

    @classmethod
    async def open(cls, settings: Settings, dsn: str, *, min_size: int | None = None) -> Database:
        """Open a pool of `min_size` (default `min_pool_size`) to `max_pool_size` connections to
        `dsn` (those above `min_size` close after 5 minutes unused); `direct_dsn` is
        `settings.direct_database_url`, or `dsn` when unset.

        Behind a pooler (the two differ) the pool prepares no named statement (a later use of
        it may land on another server connection: `statement_cache_size=0`, with which asyncpg
        also sends each statement's Parse again with its Bind, before one Sync) and sends no
        `application_name`: a server connection keeps it after its client has gone, and the
        rescue reads it to tell whether a worker process lives (`job_workers_alive`), so
        only direct sessions carry it.
        Raises: `OSError` or `asyncpg.PostgresError` when the server cannot be reached.
        """
        direct_dsn = session_dsn(settings, dsn)
        options: dict[str, Any] = {"server_settings": {"application_name": application_name()}}
        if direct_dsn != dsn:
            options = {"statement_cache_size": 0}
        pool = await asyncpg.create_pool(
            dsn,
            min_size=settings.min_pool_size if min_size is None else min_size,
            max_size=settings.max_pool_size,
            command_timeout=settings.db_command_timeout.total_seconds(),
            init=_init_connection,
            reset=_keep_session,
            **options,
        )
        return cls(pool, dsn, direct_dsn)

    async def close(self) -> None:
        """Await the `before_close` callbacks, then close the pool, waiting for connections in
        use to be released."""
        for callback in self.before_close:
            await callback()
        await self.pool.close()


@dataclass
class Transaction:
    """The transaction in progress: its connection and what to do once it has committed."""

    conn: Connection
    readonly: bool
    after_commit: list[Callable[[], None]] = field(default_factory=list)


_database: ContextVar[Database | None] = ContextVar("jobq_database", default=None)
_transaction: ContextVar[Transaction | None] = ContextVar("jobq_transaction", default=None)


def bind(database: Database) -> None:
    """Make `database` the one that `transaction()` uses in the current context."""
    _database.set(database)


def current_database() -> Database:
    """Return the bound `Database`. Raises `RuntimeError` when none is bound."""
    database = _database.get()
    if database is None:
        raise RuntimeError("no Database is bound in this context (see jobq.db.bind)")
    return database


def current_transaction() -> Transaction | None:
    """Return the transaction in progress in this context, or None."""
    return _transaction.get()


@asynccontextmanager
async def transaction(*, readonly: bool = False) -> AsyncIterator[Connection]:
    """Run the block in one transaction and yield its connection.

    Outermost use: takes a pooled connection, commits when the block ends, rolls back when
    it raises, then runs the `after_commit` callbacks. Nested use: joins the outer
    transaction through a savepoint (an error inside rolls back only the block).
    Raises: whatever the block raises; `asyncpg` errors from the database.
    """
    outer = _transaction.get()
    if outer is not None:
        async with outer.conn.transaction():
            yield outer.conn
        return
    async with current_database().pool.acquire() as conn:
        tx = Transaction(conn=conn, readonly=readonly)
        token = _transaction.set(tx)
        try:
            async with conn.transaction(readonly=readonly):
                yield conn
        finally:
            _transaction.reset(token)
    for callback in tx.after_commit:
        callback()


def _transactional(
    readonly: bool,
) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Coroutine[Any, Any, T]]]:
    def decorate(fn: Callable[P, Awaitable[T]]) -> Callable[P, Coroutine[Any, Any, T]]:
        @functools.wraps(fn)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
            async with transaction(readonly=readonly):
                return await fn(*args, **kwargs)

        return wrapper

    return decorate


write_transaction = _transactional(readonly=False)
"""Run the decorated coroutine in one transaction: commit on return, roll back on exception.
Put it under the route decorator (`@bp.post(...)` outermost)."""

read_transaction = _transactional(readonly=True)
"""Like `write_transaction`, in a READ ONLY transaction."""


def conn() -> Connection:
    """Return the connection of the transaction in progress. Raises `RuntimeError` outside one."""
    tx = _transaction.get()
    if tx is None:
        raise RuntimeError("no transaction in progress (use write_transaction/read_transaction)")
    return tx.conn


def json_arg(value: Any) -> str:
    """Encode a value for a `$n::jsonb` parameter given as text, its keys sorted: equal values
    encode alike, so the text also keys a value (`store.enqueue_many`'s twins)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True)
