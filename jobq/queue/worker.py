"""The worker: claims ripe jobs into free slots, runs them, records outcomes, rescues the lost.

One `Worker` per process. It serves a set of queues, each with its own slots (`Slots`):
`Settings.queues`, or every declared queue. One claim fills the free slots of all of them. Its
listener connection LISTENs on `jobq` and holds the session advisory lock (`WORKER_LOCK_CLASS`,
worker id) that tells every other worker this one is alive: when the process dies, PostgreSQL
drops the session and the lock, and the next rescue (every `rescue_interval`, in the elected
leader: `jobq.queue.leader`) returns its jobs to the queue. A worker that is connected but hung
stops heartbeating, its leases expire, and its jobs are rescued too. Every outcome names the
job's fencing token, so a stale worker changes nothing.

Wake-ups: a notification, an in-process event after an enqueue commits here, a slot freed,
the timer at the next `ripe_at`, the poll interval (the safety net), and stop.

How one job runs and its outcome is recorded is `jobq.queue.executor`'s part.

Every background service has one shape (`jobq.queue.service.Service`): `run_once()` does one
round and returns a count; `run(stop)` loops on it. Here: `run_once` (claim) and `heartbeat`,
which also takes or renews the lead; `run` also runs the metrics' flush (`jobq.queue.metrics`)
and the leader's services (`jobq.queue.leader`: rescue, pruning, schedules, the depth snapshot),
whose rounds run only while this worker leads.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import socket
from collections import Counter
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from jobq import clock, db, tracing
from jobq.config import Settings
from jobq.db import Connection, Database
from jobq.queue import hub, leader, metrics, notify, schedule, sql, store
from jobq.queue.acker import Acker
from jobq.queue.executor import Executor, describe
from jobq.queue.hub import Hub
from jobq.queue.model import ClaimedJob
from jobq.queue.registry import Registry, registry
from jobq.queue.service import Service
from jobq.queue.slots import Slots, has_limits, served_queues

log = logging.getLogger("jobq.worker")

CLAIM_SESSION = {
    "plan_cache_mode": "force_generic_plan",
    "jit": "off",
    "enable_seqscan": "off",
}
"""The settings of the session that claims (the listener's). JIT compiling the claim (its
estimates can look big) costs far more than running it. Index scans only: the generic plan is
made at the first claim, often on an empty queue, and there a scan of `job` looks cheapest; kept,
it read every queued job at each claim (1.2 ms of the claim's 1.4 at 20,000 queued) until an
analyze replanned."""

FOLLOWER_POLLS = 3
"""A follower of its host's hub naps this many poll intervals at most. At the end of such a
nap it claims nothing: it tells its hub again that it is idle (in case a word was lost), and
the hub's poll, which wakes idle followers for the queues the hub has no room in, covers it.
Polls that claimed in every follower added up, in a fleet, to workers joining a drain of fast
jobs that one worker kept up with, each costing the database more per job (`python -m bench
fleet`, busy). A follower still claims when woken, when a job it knows of ripens, and, polling
each poll interval, while its hub does not answer (`Hub.orphaned`)."""

SLOW_JOB_S = 0.001
"""Jobs that run this many seconds or more, on average in this worker by their types, keep
their queue's slots taken longer than a claim takes to fill them again (a claim of 16 jobs and
their start: about 0.5 ms of the worker's time here): a claim that fills that queue's slots
with such jobs asks the host's hub for another worker. Faster jobs leave the worker's own
loop as what limits it, and more workers taking turns on the same cores cost the database
more per job (`python -m bench fleet`, busy). Before a worker knows how long a type's jobs
run, a claim that fills a queue with some waits this long for one of its jobs to end, and asks
for help if none does."""

RUN_TIME_WEIGHT = 0.2
"""The weight of a job's run time in its type's moving average (`Worker._run_s`)."""


class Worker:
    """Claims and runs jobs. `start()`, then `run(stop)`; or, in tests, `run_once()` and
    `wait_idle()`. Stop with `stop()` (graceful) or `abort()` (hard).

    `state` is handed to every handler as `JobContext.state` (settings, HTTP client, ...).
    """

    def __init__(
        self,
        database: Database,
        settings: Settings,
        *,
        handlers: Registry = registry,
        state: dict[str, Any] | None = None,
    ) -> None:
        self.database = database
        self.settings = settings
        self.handlers = handlers
        self.state = state if state is not None else {}
        self.id: int | None = None
        self.counts: Counter[str] = Counter()
        """claimed, completed, retried, buried, released, rejected (stale token), lost_acks."""
        self._listener: asyncpg.Connection[asyncpg.Record] | None = None
        self._listening = False
        """The listener LISTENs (this worker is its host's hub, or there is no hub)."""
        self._hub: Hub | None = None
        self._hub_woke = False
        """The hub woke this worker since its last nap."""
        self._leading = asyncio.Event()
        """Set while this worker leads the fleet's upkeep (`leader`); its services wait for it."""
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._claim_lock = asyncio.Lock()
        self._claimed = False
        """The last round claimed (else it only recorded outcomes, or did nothing)."""
        self._next_ripe_at: datetime | None = None
        """What the last round's claim said of the queues it did not fill: when a claim of
        theirs may next find work (None: nothing queued there, no rate window to wait for)."""
        self._filled: dict[str, list[str]] = {}
        """The queues of which the last round's claim took as many jobs as they had free slots
        (more of their jobs may be ripe), each with the types of the jobs it took there. Of the
        others, none was ripe (or unlocked) by then."""
        self._tasks: dict[asyncio.Task[None], ClaimedJob] = {}
        self._ended = 0
        """How many of this worker's jobs have ended (their tasks done)."""
        self._run_s: dict[str, float] = {}
        """The moving average of the seconds a job runs (its attempt, from its first step), by
        job type: what a type ran before predicts it, where a queue's average would carry one
        type's run time over to the next (stamps of 2 ms, then a burst of no-ops)."""
        self.slots = Slots(served_queues(settings, handlers))
        self._limited: set[str] = set()
        """Served queues with limits (as declared here): their claims may be held back by jobs
        still running."""
        self._recheck = False
        """The last claim recorded outcomes of limited queues: claim again (it frees room that
        the same statement's turns may not have seen)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self.acker = Acker(
            database,
            settings,
            self.counts,
            self.slots.release,
            limited=lambda job: job.queue in self._limited,
        )
        self.executor = Executor(settings, handlers, self.state, self.acker)

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Register this worker: open the listener, take the liveness lock, LISTEN.

        Raises: `OSError` / `asyncpg.PostgresError` when the database cannot be reached.
        """
        self._loop = asyncio.get_running_loop()
        specs = self.handlers.queues()
        self._limited = {n for n in self.slots.capacity if has_limits(specs[n])}
        async with self.database.pool.acquire() as conn, conn.transaction():
            await store.declare_queues(conn, specs.values())
            await schedule.declare(conn, self.handlers.schedules(), now=clock.now())
        if hub.SUPPORTED:
            self._hub = Hub(
                hub.hub_address(self.database.direct_dsn),
                wake=self._woken,
                cancel=self.cancel_running,
                listen=self._on_listen,
            )
            self._hub.open()
        await self._connect()
        assert self.id is not None
        self.executor.open(self.id)
        store.wakeups.add(self._wake)
        log.info(
            "worker %s started: queues %s, %d threads",
            self.id,
            ", ".join(f"{n}:{k}" for n, k in self.slots.capacity.items()),
            self.settings.max_threads,
        )

    async def _connect(self) -> None:
        # The claims run here too: a worker claims only while it holds its liveness lock. Their
        # statement is planned once (a generic plan): planning it anew each time costs more
        # than running it; tests read both plans (tests/queue/test_explain.py).
        # A session of its own: straight to the server when the pool goes through a pooler.
        conn = await db.connect(
            self.database.direct_dsn,
            server_settings=CLAIM_SESSION,
            command_timeout=self.settings.db_command_timeout.total_seconds(),
        )
        try:
            if self.id is None:
                self.id = await sql.worker_next_id.fetchval(conn)
            if not await sql.worker_lock.fetchval(conn, worker_id=self.id):
                raise RuntimeError(f"worker id {self.id} is locked by another session")
            await sql.worker_register.execute(
                conn, worker_id=self.id, host=socket.gethostname(), pid=os.getpid(), now=clock.now()
            )
            if self._hub is None or self._hub.leading or self._hub.orphaned:
                await self._listen(conn)
            conn.add_termination_listener(self._on_listener_lost)
        except BaseException:
            await conn.close()
            raise
        self._listener = conn

    async def _listen(self, conn: asyncpg.Connection[asyncpg.Record]) -> None:
        await conn.add_listener(notify.CHANNEL, self._on_notify)
        await conn.add_listener(notify.CANCEL_CHANNEL, self._on_cancel)
        self._listening = True

    def _on_listen(self, on: bool) -> None:
        """The hub says whether this worker must LISTEN (it became the hub, or its hub does
        not answer); a listener still to connect LISTENs then."""
        if self._listener is not None and on != self._listening:
            asyncio.get_running_loop().create_task(self._relisten(on))

    async def _relisten(self, on: bool) -> None:
        try:
            async with self._claim_lock:
                listener = self._listener
                if listener is None or listener.is_closed() or self._stopping.is_set():
                    return
                if on and not self._listening:
                    await self._listen(listener)
                elif not on and self._listening:
                    await listener.remove_listener(notify.CHANNEL, self._on_notify)
                    await listener.remove_listener(notify.CANCEL_CHANNEL, self._on_cancel)
                    self._listening = False
        except Exception as exc:
            log.warning("worker %s could not (UN)LISTEN (%s)", self.id, describe(exc))
            return
        if on and self._hub is not None and self._hub.leading:
            self._hub.wake_all()  # notifications may have been missed

    def _on_notify(self, *_: object) -> None:
        if self._hub is not None:
            self._hub.notified()
        else:
            self._wake.set()

    def _on_cancel(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        if isinstance(payload, str) and payload.isdigit():
            if self._hub is not None:
                self._hub.cancelled(int(payload))
            else:
                self.cancel_running(int(payload))

    def _woken(self) -> None:
        self._hub_woke = True
        self._wake.set()

    @property
    def leader(self) -> bool:
        """This worker leads the fleet's upkeep (rescue, pruning, schedules, the depth snapshot):
        its last heartbeat took or renewed the lead (`sql.worker_heartbeat`)."""
        return self._leading.is_set()

    def cancel_running(self, job_id: int) -> bool:
        """Cancel the handler of job `job_id` if this worker runs it (`Executor.cancel`): the
        database marked it cancelled. Return whether it runs here."""
        if any(job.id == job_id for job in self._tasks.values()):
            self.executor.cancel(job_id)
            return True
        return False

    def _on_listener_lost(self, *_: object) -> None:
        if not self._stopping.is_set():
            log.warning("worker %s lost its listener connection; reconnecting", self.id)
        self._listener = None
        self._listening = False
        self._wake.set()

    @property
    def alive(self) -> bool:
        """True while the listener (and so the liveness lock) is connected."""
        return self._listener is not None and not self._listener.is_closed()

    @property
    def free_slots(self) -> int:
        """Slots (of all queues) not taken by a claimed job: running, or its outcome not
        recorded yet."""
        return self.slots.num_free

    @property
    def running(self) -> int:
        """How many claimed jobs are running now (handler not returned)."""
        return len(self._tasks)

    async def run(self, stop: asyncio.Event) -> None:
        """Claim and run jobs until `stop` is set, then `stop()` gracefully.

        Database errors are logged and retried after a short pause: the loop never dies of one.
        """
        if self._loop is None:
            await self.start()
        stopped = asyncio.Event()  # the services outlive the drain: the heartbeat keeps leases
        upkeep = leader.services(self.database, self.settings, self.handlers)  # the leader's
        for service in upkeep:
            service.when = self._leading
        services = [
            asyncio.create_task(s.run(stopped), context=contextvars.Context())
            for s in (
                Service("heartbeat", self.settings.heartbeat_interval, self.heartbeat),
                metrics.flusher(self.database, self.settings.metrics_flush_interval),
                *upkeep,
            )
        ]
        watch = asyncio.create_task(self._watch(stop))
        poll = self.settings.poll_interval.total_seconds()
        self.acker.defer()  # the claims take the outcomes of finished jobs with them
        covered = False  # this follower's poll came, and its hub's poll covers it
        try:
            while not self._stopping.is_set():
                self._wake.clear()
                try:
                    if covered:
                        took, free = 0, self.slots.free()
                    else:
                        ended = self._ended
                        took = await self.run_once()
                        free = self.slots.free()
                        if any(free[name] > 0 for name in self._filled) or (
                            self._recheck and self.free_slots > 0
                        ):
                            continue  # more may be ripe where there is room, or a limit freed
                        unknown = any(self._run_time(name) is None for name in self._filled)
                        if unknown and await self._keeps_up(ended):
                            continue  # a job ended at once: the next claim knows how long
                    self._tell_hub(free, took)
                    timeout = self._poll_s() if self.free_slots <= 0 else await self._idle_timeout()
                except Exception as exc:
                    log.warning("worker %s: claim failed (%s); retrying", self.id, describe(exc))
                    timeout = min(poll, 1.0)
                covered = False
                if not await self._nap(timeout) and self._hub is not None:
                    room = [name for name, n in self.slots.free().items() if n > 0]
                    if self._hub.leading:
                        self._hub.polled(room)
                    elif not self._hub.orphaned and room and timeout >= self._poll_s():
                        covered = True
        finally:
            await self.stop()  # the heartbeat goes on extending leases while jobs drain
            stopped.set()
            for task in (*services, watch):
                task.cancel()  # a round in flight (the database may be down) ends now
            await asyncio.gather(*services, watch, return_exceptions=True)
            await _last_flush(self.database)

    def _tell_hub(self, free: dict[str, int], took: int) -> None:
        """Before a nap: tell the hub in which queues more jobs may be ripe that this worker has
        no room for (its claim filled them; or the hub woke it and it claimed nothing, having
        no room where the work was), and in which it has room and found nothing."""
        woken, self._hub_woke = self._hub_woke, False
        if self._hub is None:
            return
        run_s = {name: self._run_time(name) for name in self._filled}
        full = {name for name, took in run_s.items() if took is None or took >= SLOW_JOB_S}
        if woken and not took:
            full |= {name for name, n in free.items() if n <= 0}
        if full:
            self._hub.more(sorted(full))
        room = sorted(name for name, n in free.items() if n > 0)
        if room:
            self._hub.idle(room)

    def _run_time(self, queue: str) -> float | None:
        """The seconds the jobs that the last claim took in `queue` (one it filled) run, on
        average by their types' moving averages; None while one of the types has none yet."""
        types = self._filled[queue]
        known = [self._run_s[t] for t in types if t in self._run_s]
        return sum(known) / len(known) if len(known) == len(types) else None

    async def _keeps_up(self, ended: int) -> bool:
        """Whether one of this worker's jobs ended since its claim began (`ended`: the count
        of jobs ended then), waiting for one up to `SLOW_JOB_S` (a wake-up for anything else
        ends the wait)."""
        if self._ended == ended:
            await self._nap(SLOW_JOB_S)
        return self._ended > ended

    async def _watch(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self._stopping.set()
        self._wake.set()

    async def _nap(self, seconds: float) -> bool:
        """Sleep until woken or `seconds` have passed; return whether woken."""
        try:
            async with asyncio.timeout(seconds):
                await self._wake.wait()
        except TimeoutError:
            return False
        return True

    def _poll_s(self) -> float:
        poll = self.settings.poll_interval.total_seconds()
        if self._hub is not None and not (self._hub.leading or self._hub.orphaned):
            return poll * FOLLOWER_POLLS  # a follower whose hub answers
        return poll

    async def _idle_timeout(self) -> float:
        """Seconds until the next job ripens, at most the poll interval (a follower's: times
        `FOLLOWER_POLLS`).

        "Next" is after the last claim's time, not after now: a job that ripened between that
        claim and now (a timer fires up to a millisecond early) is due at once, rather than
        waiting for the one after it. The claim itself tells when its queues may next find
        work (`store.Claimed.next_ripe_at`), so an idle worker asks with no second statement;
        only when no claim ran this round does it ask (`store.next_ripe_at`).
        """
        poll = self._poll_s()
        now = clock.now()
        if self._claimed:  # the claim said (the usual case)
            upcoming = self._next_ripe_at
        else:
            queues = [name for name, free in self.slots.free().items() if free > 0]
            async with self.database.pool.acquire() as conn:
                upcoming = await store.next_ripe_at(conn, now=now, queues=queues)
        if upcoming is None:
            return poll
        return max(0.0, min(poll, (upcoming - now).total_seconds()))

    async def stop(self, drain_timeout: timedelta | None = None) -> None:
        """Graceful stop: claim nothing more (sleeps end at once), let running jobs finish for
        up to `drain_timeout` (default `settings.drain_timeout`), then `abort()` the rest."""
        self._stopping.set()
        self._wake.set()
        self._hand_over()
        async with self._claim_lock:
            pass  # a claim in flight finishes and starts its jobs
        self.acker.undefer()  # no more claims: outcomes are recorded as jobs finish
        drain = self.settings.drain_timeout if drain_timeout is None else drain_timeout
        timeout = drain.total_seconds()
        if self._tasks:
            log.info("worker %s draining %d jobs (%.1fs)", self.id, len(self._tasks), timeout)
            await asyncio.wait(list(self._tasks), timeout=timeout)
        await self.abort()

    async def abort(self) -> None:
        """Hard stop: cancel the async handlers still running (and sync ones still waiting for
        a thread); their jobs go back to the queue, ripe now, with no attempt charged. A sync
        handler already in a thread cannot be cancelled: it is waited for and its outcome
        recorded. Jobs already recording their outcome finish that. Then unregister and close
        the listener (which releases the liveness lock)."""
        self._stopping.set()
        self._wake.set()
        self._hand_over()
        async with self._claim_lock:
            pass  # a claim in flight starts its jobs first; they are cancelled below
        if len(self._tasks) > self.executor.cancel_handlers():
            log.warning(
                "worker %s: waiting for jobs running in threads (they cannot be cancelled)", self.id
            )
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.acker.flush()
        store.wakeups.discard(self._wake)
        self.executor.close()
        if self.id is not None:
            try:
                async with self.database.pool.acquire() as conn:
                    await sql.worker_unregister.execute(conn, worker_id=self.id)
            except Exception as exc:
                log.warning("worker %s: could not unregister (%s)", self.id, describe(exc))
        async with self._claim_lock:  # no LISTEN in flight on it
            if self._listener is not None:
                listener, self._listener = self._listener, None
                await listener.close()
        log.info("worker %s stopped: %s", self.id, dict(self.counts))

    def _hand_over(self) -> None:
        """Stop being the host's hub: wake the followers, the first of which to find no hub
        becomes it."""
        if self._hub is not None:
            if self._hub.leading:
                self._hub.wake_all()
            self._hub.close()

    async def wait_idle(self) -> None:
        """Wait until every claimed job has run and its outcome is recorded (for tests)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.acker.flush()

    # -- one round of each service ---------------------------------------------------------

    async def run_once(self) -> int:
        """Record the outcomes of finished jobs and claim up to the slots that frees, in one
        statement, and start the claimed jobs; return how many were claimed.

        Claims nothing while stopping or while the liveness lock is not held (outcomes are
        still recorded). One claim at a time per worker, so free slots are never counted twice.
        Raises: `asyncpg.PostgresError` / `OSError` (the outcomes wait for the next round).
        """
        async with self._claim_lock:
            self._claimed = False
            self._filled = {}
            batch = self.acker.take()
            claiming = not self._stopping.is_set() and self.alive and self.id is not None
            free = self.slots.free([job for job, _ in batch]) if claiming else {}
            free = {name: n for name, n in free.items() if n > 0}
            self._recheck = False
            if not batch and not free:
                return 0
            now = clock.now()
            try:
                async with self._claim_connection() as conn:
                    claimed = await store.record_and_claim(
                        conn,
                        [outcome for _, outcome in batch],
                        worker_id=self.id or 0,
                        max_jobs=free,
                        now=now,
                        lease_expires_at=now + self.settings.lease,
                        retain=self.settings.retain,
                    )
            except BaseException:
                self.acker.restore(batch)
                listener = self._listener
                if listener is not None and not listener.is_closed():
                    # A statement cut short (a killed backend, a cancellation) can leave the
                    # connection in a state where every later one fails; its liveness lock is
                    # in doubt too. Drop it: the next heartbeat connects a fresh one, and the
                    # heartbeat grace keeps this worker's jobs meanwhile.
                    listener.terminate()
                raise
            jobs, recorded, next_ripe_at = claimed
            taken = Counter(job.queue for job in jobs)
            self.acker.settle(batch, recorded)
            # outcomes of queues with limits recorded in this claim may free room its turns
            # did not see: claim again
            self._recheck = bool(free) and any(job.queue in self._limited for job, _ in batch)
            if free:
                self._claimed = True
                self._next_ripe_at = next_ripe_at
                self._filled = {
                    name: [job.job_type for job in jobs if job.queue == name]
                    for name, n in free.items()
                    if taken[name] >= n
                }
            traced = bool(jobs) and tracing.active()
            traces = await self._traces(jobs) if traced else {}
            for job in jobs:
                self._start(job, traced, traces.get(job.id))
            self.counts["claimed"] += len(jobs)
            metrics.count_claimed(jobs)
            return len(jobs)

    async def _traces(self, jobs: list[ClaimedJob]) -> dict[int, str]:
        """The trace contexts of the claimed `jobs` (`jobq.tracing.recall`); none when they
        cannot be read (the jobs then run in spans of their own)."""
        try:
            async with self.database.pool.acquire() as conn:
                return await tracing.recall(conn, [job.id for job in jobs])
        except Exception as exc:
            log.warning("worker %s: could not read trace contexts (%s)", self.id, describe(exc))
            return {}

    @asynccontextmanager
    async def _claim_connection(self) -> AsyncIterator[Connection]:
        """The listener while it is connected (so claims need the liveness lock), else a pooled
        connection (to record outcomes while the listener reconnects)."""
        if self._listener is not None and not self._listener.is_closed():
            yield self._listener
        else:
            async with self.database.pool.acquire() as conn:
                yield conn

    async def heartbeat(self) -> int:
        """Extend the leases of the jobs this worker holds to now + lease (and its row's
        heartbeat_at), cancel the handlers of those cancelled (a notification missed), take or
        renew the lead of the upkeep (`sql.worker_heartbeat`), say hello to the host's hub,
        then reconnect the listener if it was lost; return how many leases were extended."""
        now = clock.now()
        async with self.database.pool.acquire() as conn:
            beat = await sql.worker_heartbeat.fetchrow(
                conn,
                worker_id=self.id,
                now=now,
                lease_expires_at=now + self.settings.lease,
                tokens=self.slots.tokens,
                lead_expires_at=now + self.settings.heartbeat_grace,
                offer=not self._stopping.is_set(),
            )
        for job_id in beat["cancelled"]:
            self.cancel_running(job_id)
        if beat["leader"]:
            self._leading.set()
        else:
            self._leading.clear()
        if self._hub is not None:
            self._hub.hello()
        if not self.alive and not self._stopping.is_set():
            await self._connect()
            log.info("worker %s reconnected its listener", self.id)
            await self._release_orphans()
            self._wake.set()
            if self._hub is not None and self._hub.leading:
                self._hub.wake_all()  # notifications were missed while it was away
        return int(beat["leased"])

    async def _release_orphans(self) -> None:
        """After a lost connection: a claim may have committed without its answer reaching this
        worker. Its jobs, which never started, go back now rather than after their lease."""
        assert self.id is not None
        async with self._claim_lock, self.database.pool.acquire() as conn:
            count = await store.release_orphans(
                conn,
                worker_id=self.id,
                held=self.slots.tokens,
                now=clock.now(),
                retain=self.settings.retain,
            )
        if count:
            log.warning("worker %s: %d claimed jobs never reached it; released", self.id, count)
            store.wake_workers(self.database)

    async def enqueue_scheduled(self) -> int:
        """One round of the scheduler (`jobq.queue.leader.schedules.enqueue_due`) for this
        worker's job types, whether it leads or not; return how many occurrences were
        enqueued."""
        return await leader.schedules.enqueue_due(self.database, self.handlers, now=clock.now())

    async def rescue(self) -> int:
        """One round of the rescue (`jobq.queue.leader.rescue.rescuer`), whether this worker
        leads or not; return how many jobs were rescued."""
        return await leader.rescuer(self.database, self.settings).run_once()

    # -- running one job -------------------------------------------------------------------

    def _start(self, job: ClaimedJob, traced: bool = False, traceparent: str | None = None) -> None:
        assert self._loop is not None
        context = contextvars.Context()  # a clean context: never a request's connection
        context.run(db.bind, self.database)
        attempt = self.executor.execute(job, traced=traced, traceparent=traceparent)
        task = self._loop.create_task(self._timed(attempt, job.job_type), context=context)
        self._tasks[task] = job
        self.slots.take(job)
        task.add_done_callback(self._on_done)

    async def _timed(self, attempt: Coroutine[Any, Any, None], job_type: str) -> None:
        """Run `attempt`, a job of `job_type`, and count its run time in the type's average."""
        assert self._loop is not None
        started = self._loop.time()
        try:
            await attempt
        finally:
            took = self._loop.time() - started
            average = self._run_s.get(job_type, took)
            self._run_s[job_type] = average + RUN_TIME_WEIGHT * (took - average)

    def _on_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.pop(task, None)  # its token stays held until the acker settles its outcome
        self._ended += 1
        self._wake.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("job task crashed", exc_info=task.exception())


async def _last_flush(database: Database) -> None:
    """A graceful stop's last flush of the metrics (logged, never raised: the database may be
    gone)."""
    try:
        await metrics.flush(database)
    except Exception as exc:
        log.warning("could not flush the metrics (%s)", describe(exc))
