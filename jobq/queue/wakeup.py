"""Wake-ups: what ends a worker's nap so that it claims.

- An enqueue that commits in this process sets the wake-up events of this process's workers
  (`wake_workers`, `wake_workers_after_commit`), and sends `NOTIFY jobq` for the workers of
  every process (coalesced, after the commit: `jobq.queue.notify`).
- A notification: heard by the worker that LISTENs on the host (its hub, `jobq.queue.hub`),
  which wakes as many of its host's workers as there is work for; without a hub, by each worker.
- The timer at the next `ripe_at`, told by the last claim (`Wakeups.idle_timeout`).
- The poll interval, the safety net for a lost word (a follower of a hub: `FOLLOWER_POLLS`).
- A job that ends (its slot frees), a lost listener, and stop.

`Wakeups` holds one worker's side of all of these; the worker owns it and claims when it says.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

import asyncpg

from jobq import clock
from jobq.config import Settings
from jobq.db import Database, current_database, current_transaction
from jobq.queue import hub
from jobq.queue.executor import describe
from jobq.queue.hub import Hub
from jobq.queue.notify import CANCEL_CHANNEL, CHANNEL, notifier
from jobq.queue.slots import Slots

log = logging.getLogger("jobq.worker")

FOLLOWER_POLLS = 3
"""A follower of its host's hub naps this many poll intervals at most, and then claims nothing:
it tells its hub again that it is idle, and the hub's poll covers it (claims in every follower
would join a drain one worker keeps up with, each costing the database more per job). A
follower still claims when woken, when a job it knows of ripens, and at each poll interval
while its hub does not answer (`Hub.orphaned`)."""

SLOW_JOB_S = 0.001
"""Jobs that run this long or longer (a moving average by type) keep their slots longer than a
claim takes to fill them again: a claim that fills a queue with such jobs asks the host's hub
for another worker. Faster jobs leave the worker's own loop as the bound, where more workers
would only cost the database more per job. Before a type's run time is known, a claim that
fills a queue waits this long for a job to end, and asks for help if none does."""

RUN_TIME_WEIGHT = 0.2
"""The weight of a job's run time in its type's moving average (`Wakeups.ran`)."""


class Alarm(asyncio.Event):
    """A worker's wake-up event that tells news (anything that may have put work in its queues:
    an enqueue, a notification, the hub, a stop, the timer, the poll) from a job of its own
    ending (`set_quietly`), which makes only some queues worth claiming (`worth_claiming`)."""

    def __init__(self) -> None:
        super().__init__()
        self.news = False
        self.quiet = False

    def set(self) -> None:
        self.news = True
        super().set()

    def set_quietly(self) -> None:
        self.quiet = True
        super().set()


events: set[asyncio.Event] = set()
"""The wake-up events of this process's workers (`Wakeups.subscribe`)."""


def wake_workers(database: Database) -> None:
    """Wake the workers: those of this process at once (their events), those of every process
    by `NOTIFY jobq` on `database` (coalesced: `jobq.queue.notify`). Call it after the commit
    that put jobs in `job`."""
    for event in events:
        event.set()
    notifier(database).notify()


def _wake_workers_of_this_transaction() -> None:
    wake_workers(current_database())


def wake_workers_after_commit() -> None:
    """Wake the workers once the transaction in progress commits (once per transaction, and
    never when it rolls back); outside a transaction, now."""
    tx = current_transaction()
    if tx is None:
        wake_workers(current_database())
    elif _wake_workers_of_this_transaction not in tx.after_commit:
        tx.after_commit.append(_wake_workers_of_this_transaction)


class Wakeups:
    """One worker's wake-ups: its event, its nap, its timer, its LISTEN and its host's hub.

    The worker claims, then tells what its claim found (`claiming`, `claimed`), tells the hub
    (`tell_hub`) and naps (`sleep`, for `idle_timeout` seconds). `lock` is the worker's claim
    lock (a LISTEN waits for the claim on the same connection), `stopping` its stop, `cancel`
    cancels a job it may run, `next_ripe_at(now, queues)` asks when a job of `queues` ripens
    after `now` (when no claim said so this round).
    """

    def __init__(
        self,
        settings: Settings,
        slots: Slots,
        *,
        lock: asyncio.Lock,
        stopping: asyncio.Event,
        cancel: Callable[[int], object],
        next_ripe_at: Callable[[datetime, list[str]], Awaitable[datetime | None]],
    ) -> None:
        self.settings = settings
        self.slots = slots
        self.event = Alarm()
        """Set to wake the worker (its nap ends); cleared as each round of its loop begins."""
        self.hub: Hub | None = None
        self.listening = False
        """The listener LISTENs (this worker is its host's hub, or there is no hub)."""
        self.ended = 0
        """How many of the worker's jobs have ended (their tasks done)."""
        self._lock = lock
        self._stopping = stopping
        self._cancel = cancel
        self._ask = next_ripe_at
        self._listener: asyncpg.Connection[asyncpg.Record] | None = None
        self._hub_woke = False
        """The hub woke this worker since its last nap."""
        self._claimed = False
        """The last round claimed (else it only recorded outcomes, or did nothing)."""
        self._partial = False
        """This round claims some of the queues only (`worth_claiming`)."""
        self._next_ripe_at: datetime | None = None
        """What the last round's claim said of the queues it did not fill: when a claim of
        theirs may next find work (None: nothing queued there, no rate window to wait for)."""
        self._filled: dict[str, list[str]] = {}
        """The queues of which the last round's claim took as many jobs as they had free slots
        (more of their jobs may be ripe), each with the types of the jobs it took there. Of the
        others, none was ripe (or unlocked) by then."""
        self._run_s: dict[str, float] = {}
        """The moving average of the seconds a job runs (its attempt, from its first step), by
        job type: what a type ran before predicts it, where a queue's average would carry one
        type's run time over to the next (stamps of 2 ms, then a burst of no-ops)."""

    # -- lifecycle -------------------------------------------------------------------------

    def open_hub(self, dsn: str) -> None:
        """Join the hub of this host's workers on `dsn` (where there are hubs: Linux)."""
        if hub.SUPPORTED:
            self.hub = Hub(
                hub.hub_address(dsn), wake=self._woken, cancel=self._cancel, listen=self._on_listen
            )
            self.hub.open()

    def subscribe(self) -> None:
        """Be woken by the enqueues of this process (`wake_workers`) from now on."""
        events.add(self.event)

    def unsubscribe(self) -> None:
        """No longer be woken by the enqueues of this process (the worker stopped)."""
        events.discard(self.event)

    def wake(self) -> None:
        """Wake the worker now (it stops, or its listener is lost or back)."""
        self.event.set()

    def hand_over(self) -> None:
        """Stop being the host's hub: wake the followers, the first of which to find no hub
        becomes it."""
        if self.hub is not None:
            if self.hub.leading:
                self.hub.wake_all()
            self.hub.close()

    # -- the listener ------------------------------------------------------------------------

    async def attach(self, conn: asyncpg.Connection[asyncpg.Record]) -> None:
        """The worker's listener connected: LISTEN on it if this worker hears the notifications
        (it is the hub, there is none, or its hub does not answer)."""
        if self.hub is None or self.hub.leading or self.hub.orphaned:
            await self._listen(conn)
        self._listener = conn

    def detach(self) -> None:
        """The listener is lost: wake the worker (it reconnects at its heartbeat)."""
        self._listener = None
        self.listening = False
        self.wake()

    def hello(self) -> None:
        """At each heartbeat: remind the hub of this worker (`Hub.hello`)."""
        if self.hub is not None:
            self.hub.hello()

    def reconnected(self) -> None:
        """The listener is back: claim, and let the hub wake its followers (notifications were
        missed while it was away)."""
        self.wake()
        if self.hub is not None and self.hub.leading:
            self.hub.wake_all()

    async def _listen(self, conn: asyncpg.Connection[asyncpg.Record]) -> None:
        await conn.add_listener(CHANNEL, self._on_notify)
        await conn.add_listener(CANCEL_CHANNEL, self._on_cancel)
        self.listening = True

    def _on_listen(self, on: bool) -> None:
        """The hub says whether this worker must LISTEN (it became the hub, or its hub does
        not answer); a listener still to connect LISTENs then."""
        if self._listener is not None and on != self.listening:
            asyncio.get_running_loop().create_task(self._relisten(on))

    async def _relisten(self, on: bool) -> None:
        try:
            async with self._lock:
                listener = self._listener
                if listener is None or listener.is_closed() or self._stopping.is_set():
                    return
                if on and not self.listening:
                    await self._listen(listener)
                elif not on and self.listening:
                    await listener.remove_listener(CHANNEL, self._on_notify)
                    await listener.remove_listener(CANCEL_CHANNEL, self._on_cancel)
                    self.listening = False
        except Exception as exc:
            log.warning("a worker could not (UN)LISTEN (%s)", describe(exc))
            return
        if on and self.hub is not None and self.hub.leading:
            self.hub.wake_all()  # notifications may have been missed

    def _on_notify(self, *_: object) -> None:
        if self.hub is not None:
            self.hub.notified()
        else:
            self.event.set()

    def _on_cancel(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        if isinstance(payload, str) and payload.isdigit():
            if self.hub is not None:
                self.hub.cancelled(int(payload))
            else:
                self._cancel(int(payload))

    def _woken(self) -> None:
        self._hub_woke = True
        self.event.set()

    # -- what the claims found ---------------------------------------------------------------

    def claiming(self) -> None:
        """A round begins: forget what the last claim said."""
        self._claimed = False
        self._filled = {}

    def worth_claiming(self, free: dict[str, int], ending: set[str]) -> dict[str, int]:
        """The queues of `free` (free slots by queue) a claim may find work in: all of them
        after news (`Alarm`), a round that did not claim, or no wake-up at all (a round run by
        hand); after jobs ended alone, the queues
        the last claim filled (more of their jobs may be ripe) and those in `ending` (their
        jobs' outcomes free room, which a limit may have held back). A queue left out had no
        ripe job at the last claim, and its next ripe time stays on the timer (`claimed`)."""
        news, quiet = self.event.news, self.event.quiet
        self.event.news = self.event.quiet = False
        if news or not quiet or not self._claimed:
            self._partial = False
            return free
        self._partial = True
        return {name: n for name, n in free.items() if name in self._filled or name in ending}

    def claimed(self, next_ripe_at: datetime | None, filled: dict[str, list[str]]) -> None:
        """This round claimed: `next_ripe_at` of the queues it did not fill, and the queues it
        `filled`, each with the types of the jobs it took there. After a claim of some queues
        (`worth_claiming`), the timer keeps the earlier time the claims before told of the
        others."""
        if self._partial and self._next_ripe_at is not None:
            next_ripe_at = min(next_ripe_at or self._next_ripe_at, self._next_ripe_at)
        self._claimed = True
        self._next_ripe_at = next_ripe_at
        self._filled = filled

    def room_where_filled(self, free: dict[str, int]) -> bool:
        """Whether a queue the claim filled has `free` slots now: more jobs may be ripe there."""
        return any(free[name] > 0 for name in self._filled)

    def run_times_unknown(self) -> bool:
        """Whether the claim filled a queue with jobs of a type that has not run here yet."""
        return any(self._run_time(name) is None for name in self._filled)

    def ran(self, job_type: str, seconds: float) -> None:
        """An attempt of a job of `job_type` ran `seconds`: count it in the type's average."""
        average = self._run_s.get(job_type, seconds)
        self._run_s[job_type] = average + RUN_TIME_WEIGHT * (seconds - average)

    def job_ended(self) -> None:
        """A job's task is done: its slot frees once its outcome is recorded."""
        self.ended += 1
        self.event.set_quietly()

    # -- the hub -----------------------------------------------------------------------------

    def tell_hub(self, free: dict[str, int], took: int) -> None:
        """Before a nap: tell the hub in which queues more jobs may be ripe that this worker has
        no room for (its claim filled them; or the hub woke it and it claimed nothing, having
        no room where the work was), and in which it has room and found nothing."""
        woken, self._hub_woke = self._hub_woke, False
        if self.hub is None:
            return
        run_s = {name: self._run_time(name) for name in self._filled}
        full = {name for name, took in run_s.items() if took is None or took >= SLOW_JOB_S}
        if woken and not took:
            full |= {name for name, n in free.items() if n <= 0}
        if full:
            self.hub.more(sorted(full))
        room = sorted(name for name, n in free.items() if n > 0)
        if room:
            self.hub.idle(room)

    def _run_time(self, queue: str) -> float | None:
        """The seconds the jobs that the last claim took in `queue` (one it filled) run, on
        average by their types' moving averages; None while one of the types has none yet."""
        types = self._filled[queue]
        known = [self._run_s[t] for t in types if t in self._run_s]
        return sum(known) / len(known) if len(known) == len(types) else None

    async def keeps_up(self, ended: int) -> bool:
        """Whether one of this worker's jobs ended since its claim began (`ended`: the count
        of jobs ended then), waiting for one up to `SLOW_JOB_S` (a wake-up for anything else
        ends the wait)."""
        if self.ended == ended:
            await self.nap(SLOW_JOB_S)
        return self.ended > ended

    # -- the nap -----------------------------------------------------------------------------

    async def nap(self, seconds: float) -> bool:
        """Sleep until woken or `seconds` have passed; return whether woken."""
        try:
            async with asyncio.timeout(seconds):
                await self.event.wait()
        except TimeoutError:
            return False
        return True

    async def sleep(self, seconds: float) -> bool:
        """The worker's nap between rounds (`nap`). Return whether its next round is covered
        by its hub's poll (it is a follower whose poll came: it claims nothing then). At the
        end of the hub's own poll, the hub wakes followers for the queues it has no room in."""
        if await self.nap(seconds):
            return False
        self.event.news = True  # the timer or the poll
        if self.hub is None:
            return False
        room = [name for name, n in self.slots.free().items() if n > 0]
        if self.hub.leading:
            self.hub.polled(room)
            return False
        return not self.hub.orphaned and bool(room) and seconds >= self.poll_s()

    def poll_s(self) -> float:
        """The poll interval in seconds (a follower's whose hub answers: times
        `FOLLOWER_POLLS`)."""
        poll = self.settings.poll_interval.total_seconds()
        if self.hub is not None and not (self.hub.leading or self.hub.orphaned):
            return poll * FOLLOWER_POLLS  # a follower whose hub answers
        return poll

    async def idle_timeout(self) -> float:
        """Seconds until the next job ripens, at most the poll interval (`poll_s`).

        "Next" is after the last claim's time, not after now: a job that ripened between that
        claim and now (a timer fires up to a millisecond early) is due at once, rather than
        waiting for the one after it. The claim itself tells when its queues may next find
        work (`store.Claimed.next_ripe_at`), so an idle worker asks with no second statement;
        only when no claim ran this round does it ask (`store.next_ripe_at`).
        """
        poll = self.poll_s()
        now = clock.now()
        if self._claimed:  # the claim said (the usual case)
            upcoming = self._next_ripe_at
        else:
            queues = [name for name, free in self.slots.free().items() if free > 0]
            upcoming = await self._ask(now, queues)
        if upcoming is None:
            return poll
        return max(0.0, min(poll, (upcoming - now).total_seconds()))
