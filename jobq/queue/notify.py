"""Waking the workers of every process: `NOTIFY jobq`, sent on its own after a commit that put
jobs in the queue, at most one in flight per pool (the ones asked for meanwhile make one more).

Why not NOTIFY inside the enqueuing transaction (a trigger, as many queues do): PostgreSQL
serialises the commits of transactions that notified. It takes a database-wide lock before the
commit and holds it through the commit's WAL flush, so concurrent enqueues commit one fsync at a
time instead of sharing one (group commit). A NOTIFY sent alone writes no WAL and holds that
lock for microseconds, and coalescing makes one serve every commit that came before it was sent.

The price: a job inserted by plain SQL wakes nobody until the next poll, unless that
transaction also runs `NOTIFY jobq`. Workers of this process are woken directly
(`jobq.queue.wakeup.wake_workers`), without waiting for the notification.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import weakref

from jobq.db import Database

log = logging.getLogger("jobq.notify")

CHANNEL = "jobq"
"""The channel workers LISTEN on."""

CANCEL_CHANNEL = "jobq_cancel"
"""Workers LISTEN on it too: a running job was cancelled (payload: its id)."""

DONE_CHANNEL = "jobq_done"
"""A job that someone awaits ended (payload: its id); `jobq.queue.control.wait_for` hears it."""


class Notifier:
    """Sends `NOTIFY jobq` on a pooled connection of `database`, coalesced."""

    def __init__(self, database: Database) -> None:
        self._database = weakref.ref(database)  # the database owns its notifier, not the reverse
        self._sending: asyncio.Task[None] | None = None
        self._again = False

    def notify(self) -> None:
        """Make sure a notification is sent after this call; never blocks.

        A notification in flight may have been sent before the caller's commit, so a second one
        follows it; every call made meanwhile shares that second one.
        """
        if self._sending is not None:
            self._again = True
            return
        self._sending = asyncio.get_running_loop().create_task(
            self._send(), context=contextvars.Context()
        )

    async def flush(self) -> None:
        """Wait until the notifications asked for so far are sent (or failed)."""
        while self._sending is not None:
            await asyncio.shield(self._sending)

    async def _send(self) -> None:
        try:
            again = True
            while again:
                self._again = False
                database = self._database()
                if database is None:
                    return
                try:
                    async with database.pool.acquire() as conn:
                        await conn.execute("SELECT pg_notify($1, '')", CHANNEL)
                except Exception as exc:
                    # The workers' poll is the safety net for a lost notification.
                    log.warning("could not notify the workers (%s: %s)", type(exc).__name__, exc)
                    return
                again = self._again
        finally:
            self._sending = None


_notifiers: weakref.WeakKeyDictionary[Database, Notifier] = weakref.WeakKeyDictionary()


def notifier(database: Database) -> Notifier:
    """Return the `Notifier` of `database` (one per pool)."""
    found = _notifiers.get(database)
    if found is None:
        found = _notifiers[database] = Notifier(database)
        database.before_close.append(found.flush)  # a producer that exits still wakes them
    return found
