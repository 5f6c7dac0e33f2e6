"""Completion: one recorder of a worker's job outcomes, which it records in batches (the
completions, re-queues and burials of many jobs in one statement, one batch in flight at a time).

The executor reports each attempt's `Outcome` with `Completer.report`, and nothing else. While
the worker claims, its claims take the waiting outcomes with them: it takes a batch
(`take_batch`), records it in its claim (`sql.job_claim`) and says what became of it
(`settled`), or gives it back when the claim failed (`restore`); a finished job wakes it, and
one statement records what finished and fills the slots that freed. Otherwise (stopping, or
driven by hand in tests) the completer records them itself (`sql.job_record`): an outcome waits
for the batch in flight, if any, and one turn of the event loop, then goes with everything that
finished meanwhile. Either way batches grow with the load, like a database's group commit, and
an idle worker records an outcome at once (as River's batching `JobCompleter` does).

A job whose outcome is not recorded yet stays in `job_running` under its worker's lease (the
heartbeat extends it): a crash before the batch commits can only make it run again after the
rescue, never lose it.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections import Counter
from collections.abc import Callable

from jobq import clock
from jobq.config import Settings
from jobq.db import Database
from jobq.queue import metrics, store
from jobq.queue.model import ClaimedJob, Outcome, Verdict
from jobq.queue.wakeup import wake_workers

log = logging.getLogger("jobq.worker")

Batch = list[tuple[ClaimedJob, Outcome]]
"""Outcomes taken together to be recorded in one statement, each with its job."""


class Completer:
    """Records the outcomes of one worker's jobs in batches.

    `counts` (shared with the worker) gains, per outcome, its `Verdict.counted` name when recorded
    (and the metrics its event: `jobq.queue.metrics.count_recorded`),
    `rejected` when its token was stale (the job had been rescued), or `lost_acks` when the
    database could not be reached within one lease. `on_settled(token)` is called for each
    outcome once it is settled, whichever way.
    """

    def __init__(
        self,
        database: Database,
        settings: Settings,
        counts: Counter[str],
        on_settled: Callable[[int], None],
        limited: Callable[[ClaimedJob], bool] = lambda job: False,
    ) -> None:
        self.database = database
        self.settings = settings
        self.counts = counts
        self.on_settled = on_settled
        self.limited = limited
        """Whether a job's queue has limits: recording its outcome may let a held-back job
        start, so a batch the completer records itself wakes the workers."""
        self._pending: Batch = []
        self._flushing: asyncio.Task[None] | None = None
        self._deferred = False
        """True while the worker's claims take the outcomes (`take_batch`); else the completer
        records them itself."""

    def report(self, job: ClaimedJob, outcome: Outcome) -> None:
        """The executor's one call: `outcome` of an attempt of `job`, for the next batch; never
        blocks."""
        self._pending.append((job, outcome))
        if not self._deferred:
            self._start_flush()

    # -- the worker's side: its claims record the batches ----------------------------------

    def defer(self) -> None:
        """From now on leave the outcomes to the worker's claims (`take_batch`), which record
        them with the next claim."""
        self._deferred = True

    def take_batch(self) -> Batch:
        """Take the waiting outcomes, to be recorded by the caller and `settled` (or `restore`d
        when that failed)."""
        batch, self._pending = self._pending, []
        return batch

    def restore(self, batch: Batch) -> None:
        """Give back a batch from `take_batch` that could not be recorded; it goes first next
        time."""
        self._pending[:0] = batch
        if not self._deferred:
            self._start_flush()

    def settled(self, batch: Batch, recorded: set[int] | None) -> None:
        """Count and log what became of a batch from `take_batch`: `recorded` holds the tokens
        recorded (None: none could be); release the slots of its jobs (`on_settled`)."""
        if recorded and any(
            o.verdict is not Verdict.COMPLETE and o.verdict.requeues and o.token in recorded
            for _, o in batch
        ):
            wake_workers(self.database)  # jobs went back to `job`: any worker may take them
        counts, on_settled = self.counts, self.on_settled
        for job, outcome in batch:
            if recorded is None:
                counts["lost_acks"] += 1
            elif outcome.token in recorded:
                counts[outcome.verdict.counted] += 1
                metrics.count_recorded(job, outcome)
                if outcome.verdict is Verdict.BURY:
                    fields = {"job_id": job.id, "queue": job.queue, "job_type": job.job_type}
                    log.error(
                        "job %s (%s) is dead: %s", job.id, job.job_type, outcome.error, extra=fields
                    )
            else:
                counts["rejected"] += 1
                log.warning(
                    "job %s was rescued from this worker; its outcome (%s) is not recorded",
                    job.id,
                    outcome.verdict,
                )
            on_settled(outcome.token)

    def undefer(self) -> None:
        """From now on record outcomes without waiting for a claim to take them."""
        self._deferred = False
        if self._pending:
            self._start_flush()

    async def flush(self) -> None:
        """Record every outcome waiting now (and from now on: `undefer`), and wait until all
        are settled."""
        self.undefer()
        while self._flushing is not None:
            await asyncio.shield(self._flushing)

    def _start_flush(self) -> None:
        if self._flushing is None:
            self._flushing = asyncio.get_running_loop().create_task(
                self._flush(), context=contextvars.Context()
            )

    async def _flush(self) -> None:
        try:
            while self._pending and not self._deferred:
                await asyncio.sleep(0)  # outcomes of jobs ending in this turn join the batch
                batch = self.take_batch()
                recorded = await self._record([outcome for _, outcome in batch])
                self.settled(batch, recorded)
                if recorded and any(self.limited(j) for j, o in batch if o.token in recorded):
                    wake_workers(self.database)
        finally:
            self._flushing = None

    async def _record(self, outcomes: list[Outcome]) -> set[int] | None:
        """Run the batch's statement, retrying through database trouble for up to one lease.
        Return the tokens recorded, or None when it could not be done (the jobs' leases then
        expire and the rescue returns them to the queue: a re-run, never a loss)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.lease.total_seconds()
        delay = 0.05
        while True:
            try:
                async with self.database.pool.acquire() as conn:
                    return await store.record(
                        conn, outcomes, now=clock.now(), retain=self.settings.retain
                    )
            except Exception as exc:
                if loop.time() + delay > deadline:
                    log.error(
                        "could not record %d job outcomes (%s: %s); their leases will expire",
                        len(outcomes),
                        type(exc).__name__,
                        exc,
                    )
                    return None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
