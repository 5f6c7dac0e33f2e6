"""A handler's say over its retries: `Snooze` (run again later, no attempt charged) and the
retry policy given at registration (`max_retries`, `backoff`), on a frozen clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from freezegun import freeze_time
from pydantic import BaseModel

from jobq.db import Connection
from jobq.errors import Snooze
from jobq.queue import Job, JobContext, Registry, enqueue
from jobq.queue.backoff import Backoff
from tests.queue.helpers import MakeWorker, counts, row

T0 = datetime(2030, 6, 1, 12, 0, tzinfo=UTC)


class Args(BaseModel):
    n: int


@pytest.mark.parametrize("how", ["raise", "return", "sync-raise"])
async def test_a_snooze_charges_no_attempt_and_the_job_runs_again_after_its_delay(
    conn: Connection, make_worker: MakeWorker, how: str
) -> None:
    attempts: list[int] = []
    handlers = Registry()

    if how == "sync-raise":

        @handlers.handler("nap", args=Args)
        def nap_sync(args: Args, job: JobContext) -> None:
            attempts.append(job.attempt)
            if len(attempts) == 1:
                raise Snooze(600)

    else:

        @handlers.handler("nap", args=Args)
        async def nap(args: Args, job: JobContext) -> Snooze | None:
            attempts.append(job.attempt)
            if len(attempts) > 1:
                return None
            if how == "raise":
                raise Snooze(600)
            return Snooze(600)

    worker = await make_worker(handlers)
    with freeze_time(T0, real_asyncio=True) as frozen:
        created = await enqueue(Job(job_type="nap", arguments={"n": 1}, max_retries=0))
        assert await worker.run_once() == 1
        await worker.wait_idle()
        queued = await row(conn, "job", created.id)
        assert queued is not None
        # no attempt charged (max_retries 0: a failure would have buried it), no error
        assert (queued["attempts"], queued["last_error"]) == (0, None)
        assert queued["ripe_at"] == T0 + timedelta(seconds=600)
        assert worker.counts["snoozed"] == 1
        frozen.move_to(T0 + timedelta(seconds=599))
        assert await worker.run_once() == 0
        frozen.move_to(T0 + timedelta(seconds=600))
        assert await worker.run_once() == 1
        await worker.wait_idle()
    assert attempts == [1, 1]  # the same attempt, twice
    assert await counts(conn) == {"job": 0, "job_running": 0, "job_dead": 0}


def test_a_negative_snooze_is_refused() -> None:
    with pytest.raises(ValueError, match="must be >= 0"):
        Snooze(-1)


async def test_the_handlers_retry_policy_overrides_the_settings(
    conn: Connection, make_worker: MakeWorker
) -> None:
    handlers = Registry()
    policy = Backoff(timedelta(seconds=30), timedelta(seconds=40), 0)

    @handlers.handler("picky", args=Args, max_retries=1, backoff=policy)
    async def picky(args: Args, job: JobContext) -> None:
        raise ValueError(f"no {job.attempt}")

    worker = await make_worker(handlers)
    with freeze_time(T0, real_asyncio=True) as frozen:
        # an enqueue that names no max_retries takes the handler's (1), not the default (5)
        created = await enqueue(Job(job_type="picky", arguments={"n": 1}), handlers=handlers)
        queued = await row(conn, "job", created.id)
        assert queued is not None
        assert queued["max_retries"] == 1
        assert await worker.run_once() == 1
        await worker.wait_idle()
        queued = await row(conn, "job", created.id)
        assert queued is not None
        assert queued["ripe_at"] == T0 + timedelta(seconds=30)  # the handler's base, no jitter
        frozen.move_to(queued["ripe_at"])
        assert await worker.run_once() == 1
        await worker.wait_idle()
    dead = await row(conn, "job_dead", created.id)
    assert dead is not None
    assert (dead["attempts"], dead["last_error"]) == (2, "ValueError: no 2")


async def test_an_enqueue_may_still_name_its_own_retries(
    conn: Connection, make_worker: MakeWorker
) -> None:
    handlers = Registry()

    @handlers.handler("picky", args=Args, max_retries=1)
    async def picky(args: Args, job: JobContext) -> None:
        return None

    await make_worker(handlers)
    created = await enqueue(
        Job(job_type="picky", arguments={"n": 2}, max_retries=7), handlers=handlers
    )
    queued = await row(conn, "job", created.id)
    assert queued is not None
    assert queued["max_retries"] == 7


@pytest.mark.parametrize("max_retries", [-1, 101])
def test_a_bad_retry_policy_is_refused_at_registration(max_retries: int) -> None:
    with pytest.raises(ValueError, match="max_retries must be within 0-100"):
        Registry().handler("x", args=Args, max_retries=max_retries)


@pytest.mark.parametrize(
    ("base", "cap", "jitter"), [(-1, 10, 0), (10, 5, 0), (1, 10, 1.5), (1, 10, -0.1)]
)
def test_a_bad_backoff_is_refused(base: float, cap: float, jitter: float) -> None:
    with pytest.raises(ValueError, match="backoff"):
        Backoff(timedelta(seconds=base), timedelta(seconds=cap), jitter)
