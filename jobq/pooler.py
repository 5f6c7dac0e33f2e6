"""Whether a DSN reaches the server itself, or a pooler in transaction mode (PgBouncer's
`pool_mode = transaction`), whose clients share server sessions between transactions.

jobq needs sessions of its own (LISTEN, each worker's liveness advisory lock, the migrations'
lock, prepared statements on the pool): behind a transaction pooler they go through
`JOBQ_DIRECT_DATABASE_URL`. Every process checks at its start, before it migrates
(`jobq.migrate.prepare`), that the DSN of its sessions is no transaction pooler, and stops with
one line naming the setting when it is, rather than crash-looping on the first session state
that goes missing (`DuplicatePreparedStatementError`, a lost lock).

The probe, in two steps, costs a direct server one query, on the connection it then hands over
as the process's first session:

1. The server's cancel key (BackendKeyData, `get_server_pid()`) names the backend of the
   session; a pooler answers the startup with a key of its own. Equal to `pg_backend_pid()`:
   the server itself.
2. Else a pooler is in between; in session mode it gives the client one server session for
   good. The probe asks for its server's pid, then opens a second client whose transaction
   holds a server connection: a transaction pooler hands it the one the first client just
   released (PgBouncer gives the most recently used first), or the first client's next query
   lands on another one. Either shows sessions that change hands; otherwise the pooler keeps
   them (session mode), which jobq can use.
"""

from __future__ import annotations

import asyncpg

from jobq.db import Connection
from jobq.errors import JobqError


class TransactionPooler(JobqError):
    """The DSN of jobq's sessions goes through a pooler in transaction mode."""

    def __init__(self, *, direct_set: bool) -> None:
        if direct_set:
            message = (
                "JOBQ_DIRECT_DATABASE_URL goes through a pooler in transaction mode: it must "
                "reach the PostgreSQL server itself (LISTEN, the workers' liveness locks and the "
                "migrations need sessions of their own)"
            )
        else:
            message = (
                "DATABASE_URL goes through a pooler in transaction mode (PgBouncer?): set "
                "JOBQ_DIRECT_DATABASE_URL to the PostgreSQL server itself (LISTEN, the workers' "
                "liveness locks and the migrations need sessions of their own; see "
                "docs/guides/pgbouncer.md)"
            )
        super().__init__(message)


async def own_session(dsn: str) -> Connection | None:
    """A connection to `dsn` that keeps one server session for its life: the probe's own (see
    the module), handed over rather than closed, so that a process's first session costs one
    connection. `None` (the probe's connections closed) when `dsn` goes through a pooler that
    hands server sessions from one client to another between transactions.

    The connections are asyncpg's plain ones: no startup parameter but the DSN's (a pooler's
    server connection would keep an `application_name` after its client has gone) and no named
    statement, ever (`statement_cache_size=0`: one would clash with those that other clients
    left on a pooler's server sessions). Raises: `OSError`, `asyncpg.PostgresError`."""
    first: Connection = await asyncpg.connect(dsn, statement_cache_size=0)
    try:
        pid = await first.fetchval("SELECT pg_backend_pid()")
        if first.get_server_pid() == pid:
            return first
        second = await asyncpg.connect(dsn, statement_cache_size=0)
        try:
            async with second.transaction():
                shared = await second.fetchval("SELECT pg_backend_pid()") == pid or (
                    await first.fetchval("SELECT pg_backend_pid()") != pid
                )
        finally:
            await second.close()
    except BaseException:
        await first.close()
        raise
    if shared:
        await first.close()
        return None
    return first
