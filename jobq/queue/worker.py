"""The worker: claims ripe jobs into free slots, runs them, records outcomes, rescues the lost.

One `Worker` per process. It serves a set of queues, each with its own slots (`Slots`):
`Settings.queues`, or every declared queue. One claim fills the free slots of all of them, on
the worker's listener, the session that holds its liveness lock (`jobq.queue.listener`): when
the process dies, the next rescue (every `rescue_interval`, in the elected leader:
`jobq.queue.leader`) returns its jobs to the queue. A worker that is connected but hung stops
heartbeating, its leases expire, and its jobs are rescued too. Every outcome names the job's
fencing token, so a stale worker changes nothing.

What wakes it to claim is `jobq.queue.wakeup`'s part (`Wakeups`: a notification, an enqueue
in this process, a slot freed, the timer at the next `ripe_at`, the poll, the host's hub). How
one job runs is `jobq.queue.executor`'s part; the executor reports each outcome to the worker's
`Completer` (`jobq.queue.completer`), whose batches ride on the worker's claims.

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
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from jobq import clock, db, tracing
from jobq.config import Settings
from jobq.db import Database
from jobq.queue import leader, limits, metrics, schedule, sql, store
from jobq.queue.completer import Completer
from jobq.queue.executor import Executor, describe
from jobq.queue.listener import Listener
from jobq.queue.model import ClaimedJob
from jobq.queue.registry import Registry, registry
from jobq.queue.service import Service
from jobq.queue.slots import Slots, has_limits, served_queues
from jobq.queue.wakeup import Wakeups

log = logging.getLogger("jobq.worker")


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
        self._leading = asyncio.Event()
        """Set while this worker leads the fleet's upkeep (`leader`); its services wait for it."""
        self._stopping = asyncio.Event()
        self._claim_lock = asyncio.Lock()
        self._tasks: dict[asyncio.Task[None], ClaimedJob] = {}
        self.slots = Slots(served_queues(settings, handlers))
        self.wakeups = Wakeups(
            settings,
            self.slots,
            lock=self._claim_lock,
            stopping=self._stopping,
            cancel=self.cancel_running,
            next_ripe_at=self._next_ripe_at,
        )
        self.listener = Listener(database, settings, self.wakeups, self._claim_lock, self._stopping)
        self._limited: set[str] = set()
        """Served queues with limits (as declared here): their claims may be held back by jobs
        still running."""
        self._recheck: set[str] = set()
        """The limited queues whose outcomes the last claim recorded: claim them again (their
        outcomes free room that the same statement's turns may not have seen)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self.completer = Completer(
            database,
            settings,
            self.counts,
            self.slots.release,
            limited=lambda job: job.queue in self._limited,
        )
        self.executor = Executor(
            settings, handlers, self.state, self.completer.report, ran=self.wakeups.ran
        )
        self._job_context = contextvars.Context()
        """What each job's task starts from (a copy): a clean context, never a request's
        connection, with this worker's database bound."""
        self._job_context.run(db.bind, database)

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Register this worker: open the listener, take the liveness lock, LISTEN.

        Raises: `OSError` / `asyncpg.PostgresError` when the database cannot be reached.
        """
        self._loop = asyncio.get_running_loop()
        specs = self.handlers.queues()
        self._limited = {n for n in self.slots.capacity if has_limits(specs[n])}
        async with self.database.pool.acquire() as conn, conn.transaction():
            await limits.declare_queues(conn, specs.values())
            await schedule.declare(conn, self.handlers.schedules(), now=clock.now())
        self.wakeups.open_hub(self.database.direct_dsn)
        self.id = await self.listener.connect(self.id)
        self.executor.open(self.id)
        self.wakeups.subscribe()
        log.info(
            "worker %s started: queues %s, %d threads",
            self.id,
            ", ".join(f"{n}:{k}" for n, k in self.slots.capacity.items()),
            self.settings.max_threads,
        )

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

    @property
    def alive(self) -> bool:
        """True while the listener (and so the liveness lock) is connected."""
        return self.listener.alive

    async def _next_ripe_at(self, now: datetime, queues: list[str]) -> datetime | None:
        """When a claim of `queues` may next find work after `now` (`store.next_ripe_at`)."""
        async with self.database.pool.acquire() as conn:
            return await store.next_ripe_at(conn, now=now, queues=queues)

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
        self.completer.defer()  # the claims take the outcomes of finished jobs with them
        wakeups = self.wakeups
        covered = False  # this follower's poll came, and its hub's poll covers it
        try:
            while not self._stopping.is_set():
                wakeups.event.clear()
                try:
                    if covered:
                        took, free = 0, self.slots.free()
                    else:
                        ended = wakeups.ended
                        took = await self.run_once()
                        free = self.slots.free()
                        if wakeups.room_where_filled(free) or (
                            bool(self._recheck) and self.free_slots > 0
                        ):
                            continue  # more may be ripe where there is room, or a limit freed
                        if wakeups.run_times_unknown() and await wakeups.keeps_up(ended):
                            continue  # a job ended at once: the next claim knows how long
                    wakeups.tell_hub(free, took)
                    timeout = (
                        wakeups.poll_s() if self.free_slots <= 0 else await wakeups.idle_timeout()
                    )
                except Exception as exc:
                    log.warning("worker %s: claim failed (%s); retrying", self.id, describe(exc))
                    timeout = min(poll, 1.0)
                covered = await wakeups.sleep(timeout)
        finally:
            await self.stop()  # the heartbeat goes on extending leases while jobs drain
            stopped.set()
            for task in (*services, watch):
                task.cancel()  # a round in flight (the database may be down) ends now
            await asyncio.gather(*services, watch, return_exceptions=True)
            await _last_flush(self.database)

    async def _watch(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self._stopping.set()
        self.wakeups.wake()

    async def stop(self, drain_timeout: timedelta | None = None) -> None:
        """Graceful stop: claim nothing more (sleeps end at once), let running jobs finish for
        up to `drain_timeout` (default `settings.drain_timeout`), then `abort()` the rest."""
        self._stopping.set()
        self.wakeups.wake()
        self.wakeups.hand_over()
        async with self._claim_lock:
            pass  # a claim in flight finishes and starts its jobs
        self.completer.undefer()  # no more claims: outcomes are recorded as jobs finish
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
        self.wakeups.wake()
        self.wakeups.hand_over()
        async with self._claim_lock:
            pass  # a claim in flight starts its jobs first; they are cancelled below
        if len(self._tasks) > self.executor.cancel_handlers():
            log.warning(
                "worker %s: waiting for jobs running in threads (they cannot be cancelled)", self.id
            )
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.completer.flush()
        self.wakeups.unsubscribe()
        self.executor.close()
        if self.id is not None:
            try:
                async with self.database.pool.acquire() as conn:
                    await sql.worker_unregister.execute(conn, worker_id=self.id)
            except Exception as exc:
                log.warning("worker %s: could not unregister (%s)", self.id, describe(exc))
        await self.listener.close()
        log.info("worker %s stopped: %s", self.id, dict(self.counts))

    async def wait_idle(self) -> None:
        """Wait until every claimed job has run and its outcome is recorded (for tests)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.completer.flush()

    # -- one round of each service ---------------------------------------------------------

    async def run_once(self) -> int:
        """Record the outcomes of finished jobs and claim up to the slots that frees, in one
        statement, and start the claimed jobs; return how many were claimed.

        Claims nothing while stopping or while the liveness lock is not held (outcomes are
        still recorded). One claim at a time per worker, so free slots are never counted twice.
        Raises: `asyncpg.PostgresError` / `OSError` (the outcomes wait for the next round).
        """
        async with self._claim_lock:
            batch = self.completer.take_batch()
            claiming = not self._stopping.is_set() and self.alive and self.id is not None
            free = self.slots.free([job for job, _ in batch]) if claiming else {}
            ending = {job.queue for job, _ in batch} | self._recheck
            free = self.wakeups.worth_claiming({n: k for n, k in free.items() if k > 0}, ending)
            self.wakeups.claiming()
            self._recheck = set()
            if not batch and not free:
                return 0
            now = clock.now()
            try:
                async with self.listener.claim_connection() as conn:
                    claimed = await store.record_and_claim(
                        conn,
                        [outcome for _, outcome in batch],
                        worker_id=self.id or 0,
                        max_jobs=free,
                        now=now,
                        lease_expires_at=now + self.settings.lease,
                        retain=self.settings.retain,
                        limits=any(name in self._limited for name in free),
                    )
            except BaseException:
                self.completer.restore(batch)
                self.listener.drop()  # its state and its liveness lock are in doubt
                raise
            jobs, recorded, next_ripe_at, limited = claimed
            self.completer.settled(batch, recorded)
            if free:
                # outcomes of queues with limits recorded in this claim may free room its turns
                # did not see, and a queue found limited in the database (another process
                # declared its limits) is one this worker's claims count from now on: claim
                # them again
                self._limited.update(limited)
                self._recheck = {job.queue for job, _ in batch if job.queue in self._limited}
                self._recheck.update(limited)
                types: dict[str, list[str]] = {}
                for job in jobs:
                    types.setdefault(job.queue, []).append(job.job_type)
                filled = {n: types[n] for n, k in free.items() if len(types.get(n, ())) >= k}
                self.wakeups.claimed(next_ripe_at, filled)
            traced = bool(jobs) and tracing.active()
            traces = await tracing.recall(self.database, [job.id for job in jobs]) if traced else {}
            for job in jobs:
                self._start(job, traced, traces.get(job.id))
            self.counts["claimed"] += len(jobs)
            metrics.count_claimed(jobs)
            return len(jobs)

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
        self.wakeups.hello()
        if not self.alive and not self._stopping.is_set():
            await self.listener.reconnect(lambda: self.slots.tokens)
            self.wakeups.reconnected()
        return int(beat["leased"])

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
        attempt = self.executor.execute(job, traced=traced, traceparent=traceparent)
        task = self._loop.create_task(attempt, context=self._job_context.copy())
        self._tasks[task] = job
        self.slots.take(job)
        task.add_done_callback(self._on_done)

    def _on_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.pop(task, None)  # its token stays held until its outcome is settled
        self.wakeups.job_ended()
        if not task.cancelled() and task.exception() is not None:
            log.error("job task crashed", exc_info=task.exception())


async def _last_flush(database: Database) -> None:
    """A graceful stop's last flush of the metrics (logged, never raised: the database may be
    gone)."""
    try:
        await metrics.flush(database)
    except Exception as exc:
        log.warning("could not flush the metrics (%s)", describe(exc))
