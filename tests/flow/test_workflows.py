"""Workflows, batches and sequences in one process, on the real database: jobs run after the
jobs they wait for, read their results, are cancelled when one fails (or run anyway), a batch's
callback gets the counts, cancel and retry reach every job of a workflow, cycles and unknown
steps are refused before anything is written, and a workflow commits or rolls back with the
transaction it was enqueued in. `jobq.testing.drain` runs the jobs."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from jobq import clock
from jobq.config import Settings
from jobq.db import Connection, Database, transaction
from jobq.errors import InvalidWorkflow
from jobq.queue import (
    DontRetry,
    Job,
    JobContext,
    Registry,
    Workflow,
    dependencies,
    enqueue_batch,
    enqueue_workflow,
)
from jobq.queue.control import JobState, cancel, find
from jobq.queue.workflows import WorkflowState, cancel_workflow, find_workflow, retry_workflow
from jobq.testing import drain
from tests.conftest import make_settings


class Args(BaseModel):
    name: str
    fail: bool = False


def step_handlers(ran: list[str]) -> Registry:
    """`step` appends its name to `ran`, returns it with its dependencies' results in
    parentheses, or fails for good with `fail`; `tally` returns its dependencies' counts."""
    handlers = Registry()

    @handlers.handler("step", args=Args, max_retries=0)
    async def step(args: Args, job: JobContext) -> str:
        ran.append(args.name)
        if args.fail:
            raise DontRetry(f"{args.name} fails on purpose")
        inputs = (await dependencies(job.id)).results()
        return f"{args.name}({','.join(str(inputs[k]) for k in sorted(inputs))})"

    @handlers.handler("tally", args=Args)
    async def tally(args: Args, job: JobContext) -> dict[str, Any]:
        ran.append(args.name)
        deps = await dependencies(job.id)
        return {
            "succeeded": deps.succeeded,
            "failed": deps.failed,
            "cancelled": deps.cancelled,
            "results": sorted(str(d.result) for d in deps.jobs if d.result is not None),
        }

    return handlers


def step(name: str, *, fail: bool = False) -> Job:
    return Job(job_type="step", arguments={"name": name, "fail": fail})


async def state_of(conn: Connection, job_id: int) -> JobState:
    job = await find(conn, job_id, now=clock.now())
    assert job is not None
    return job.state


async def test_each_job_runs_after_the_jobs_it_waits_for_and_reads_their_results(
    database: Database, conn: Connection
) -> None:
    ran: list[str] = []
    flow = Workflow("diamond")
    a = flow.add(step("a"), name="a")
    b = flow.add(step("b"), name="b", after=[a])
    c = flow.add(step("c"), name="c", after=["a"])
    flow.add(step("d"), name="d", after=[b, c])
    made = await enqueue_workflow(flow, handlers=step_handlers(ran))
    assert made.num_waiting == 3
    assert await state_of(conn, made["d"]) is JobState.WAITING
    assert await conn.fetchval("SELECT count(*) FROM job") == 1  # waiting jobs are not in `job`

    assert await drain(handlers=step_handlers(ran)) == {"completed": 4}
    assert ran[0] == "a"
    assert set(ran[1:3]) == {"b", "c"}
    assert ran[3] == "d"
    d = await find(conn, made["d"], now=clock.now())
    assert d is not None
    assert d.result == "d(b(a()),c(a()))"
    view = await find_workflow(conn, made.id or 0, now=clock.now())
    assert (view.state, view.succeeded, view.unfinished) == (WorkflowState.SUCCEEDED, 4, 0)
    assert {s.step: s.depends_on for s in view.steps}["d"] == [made["b"], made["c"]]


async def test_a_failed_job_cancels_its_dependents_and_theirs_unless_they_run_anyway(
    database: Database, conn: Connection
) -> None:
    ran: list[str] = []
    flow = Workflow()
    bad = flow.add(step("bad", fail=True), name="bad")
    child = flow.add(step("child"), name="child", after=[bad])
    flow.add(step("grandchild"), name="grandchild", after=[child])
    flow.add(step("anyway"), name="anyway", after=[child], on_dependency_failure="run")
    made = await enqueue_workflow(flow, handlers=step_handlers(ran))

    assert await drain(handlers=step_handlers(ran)) == {"buried": 1, "completed": 1}
    assert ran == ["bad", "anyway"]  # child and grandchild never ran
    states = {name: await state_of(conn, made[name]) for name in made.names}
    assert states == {
        "bad": JobState.FAILED,
        "child": JobState.CANCELLED,
        "grandchild": JobState.CANCELLED,
        "anyway": JobState.SUCCEEDED,
    }
    view = await find_workflow(conn, made.id or 0, now=clock.now())
    assert (view.state, view.failed, view.cancelled, view.succeeded) == (
        WorkflowState.FAILED, 1, 2, 1
    )  # fmt: skip


async def test_cycles_and_unknown_steps_are_refused_before_anything_is_written(
    database: Database, conn: Connection
) -> None:
    flow = Workflow()
    flow.add(step("a"), name="a", after=["c"])
    flow.add(step("b"), name="b", after=["a"])
    flow.add(step("c"), name="c", after=["b"])
    flow.add(step("free"), name="free")
    with pytest.raises(InvalidWorkflow, match=r"cycle: (a -> c -> b -> a|b -> a -> c -> b)"):
        await enqueue_workflow(flow)

    alone = Workflow()
    alone.add(step("self"), name="self", after=["self"])
    with pytest.raises(InvalidWorkflow, match="cycle: self -> self"):
        await enqueue_workflow(alone)

    unknown = Workflow()
    unknown.add(step("a"), name="a", after=["nowhere"])
    with pytest.raises(InvalidWorkflow, match="'a' waits for 'nowhere', which the workflow"):
        await enqueue_workflow(unknown)

    twice = Workflow()
    twice.add(step("x"), name="x")
    with pytest.raises(InvalidWorkflow, match="two steps are named 'x'"):
        twice.add(step("y"), name="x")
    for table in ("job", "job_waiting", "job_flow", "job_workflow"):
        assert await conn.fetchval(f"SELECT count(*) FROM {table}") == 0


async def test_a_workflow_commits_and_rolls_back_with_the_transaction_it_is_enqueued_in(
    database: Database, conn: Connection
) -> None:
    class Refused(Exception):
        pass

    flow = Workflow()
    flow.add(step("b"), after=[flow.add(step("a"))])

    async def enqueue_then_fail() -> None:
        async with transaction():
            await enqueue_workflow(flow)
            raise Refused

    with pytest.raises(Refused):
        await enqueue_then_fail()
    for table in ("job", "job_waiting", "job_flow", "job_workflow", "job_dependency"):
        assert await conn.fetchval(f"SELECT count(*) FROM {table}") == 0
    async with transaction():
        made = await enqueue_workflow(flow)
        assert await conn.fetchval("SELECT count(*) FROM job_flow") == 0  # not committed yet
    assert await conn.fetchval("SELECT count(*) FROM job_flow") == 2
    assert await state_of(conn, made.job_ids[1]) is JobState.WAITING


async def test_a_batch_callback_runs_once_with_the_counts_and_results_of_its_jobs(
    database: Database, conn: Connection
) -> None:
    ran: list[str] = []
    jobs = [step(f"j{i}", fail=i == 3) for i in range(5)]
    batch = await enqueue_batch(
        jobs, callback=Job(job_type="tally", arguments={"name": "callback"}), name="five"
    )
    assert batch.callback_id is not None
    # one job is cancelled before it runs: the callback counts it
    assert (
        await cancel(conn, batch.job_ids[4], now=clock.now(), retain=True)
    ).state is JobState.CANCELLED
    assert await drain(handlers=step_handlers(ran)) == {"completed": 4, "buried": 1}
    assert ran.count("callback") == 1
    assert ran[-1] == "callback"
    summary = await find(conn, batch.callback_id, now=clock.now())
    assert summary is not None
    assert summary.result == {
        "succeeded": 3,
        "failed": 1,
        "cancelled": 1,
        "results": ["j0()", "j1()", "j2()"],
    }


async def test_cancelling_a_waiting_or_queued_job_cancels_the_jobs_that_wait_for_it(
    database: Database, conn: Connection
) -> None:
    flow = Workflow()
    a = flow.add(step("a"), name="a")
    b = flow.add(step("b"), name="b", after=[a])
    flow.add(step("c"), name="c", after=[b])
    made = await enqueue_workflow(flow)
    assert (await cancel(conn, made["b"], now=clock.now(), retain=True)).state is JobState.CANCELLED
    assert await state_of(conn, made["c"]) is JobState.CANCELLED
    assert await state_of(conn, made["a"]) is JobState.QUEUED

    other = Workflow()
    first = other.add(step("first"), name="first")
    other.add(step("then"), name="then", after=[first])
    made = await enqueue_workflow(other)
    assert (
        await cancel(conn, made["first"], now=clock.now(), retain=True)
    ).state is JobState.CANCELLED
    assert await state_of(conn, made["then"]) is JobState.CANCELLED
    assert await conn.fetchval("SELECT count(*) FROM job_waiting") == 0


async def test_cancelling_a_workflow_cancels_its_waiting_queued_and_running_jobs(
    database: Database, conn: Connection
) -> None:
    flow = Workflow()
    running = flow.add(step("running"), name="running")
    flow.add(step("queued"), name="queued")
    flow.add(step("waiting"), name="waiting", after=[running])
    flow.add(step("callback"), name="callback", after=["waiting"], on_dependency_failure="run")
    made = await enqueue_workflow(flow)
    await conn.execute(
        "WITH c AS (DELETE FROM job WHERE id = $1 RETURNING *)"
        " INSERT INTO job_running (id, job_type, arguments, ripe_at, priority, attempts,"
        " max_retries, created_at, unique_mode, worker_id, claimed_at, lease_expires_at, token)"
        " SELECT id, job_type, arguments, ripe_at, priority, attempts, max_retries, created_at,"
        " unique_mode, 1, $2, $2, 1 FROM c",
        made["running"],
        clock.now(),
    )  # as a claim would
    async with transaction() as tx:
        counts = await cancel_workflow(tx, made.id or 0, now=clock.now())
    assert counts == {"running": 1, "queued": 1, "waiting": 2}
    for name in ("queued", "waiting", "callback"):
        assert await state_of(conn, made[name]) is JobState.CANCELLED
    job = await find(conn, made["running"], now=clock.now())
    assert job is not None
    assert job.state is JobState.RUNNING
    assert job.cancelled_at is not None
    view = await find_workflow(conn, made.id or 0, now=clock.now())
    assert view.state is WorkflowState.RUNNING  # until its running job ends
    await conn.execute("DELETE FROM job_running WHERE id = $1", made["running"])  # its end
    view = await find_workflow(conn, made.id or 0, now=clock.now())
    assert (view.state, view.cancelled) == (WorkflowState.CANCELLED, 4)


async def test_a_retry_runs_the_failed_and_cancelled_jobs_again_and_the_workflow_ends(
    database: Database, conn: Connection
) -> None:
    ran: list[str] = []
    flow = Workflow()
    ok = flow.add(step("ok"), name="ok")
    flaky = flow.add(step("flaky", fail=True), name="flaky", after=[ok])
    flow.add(step("after"), name="after", after=[flaky])
    made = await enqueue_workflow(flow)
    await drain(handlers=step_handlers(ran))
    assert ran == ["ok", "flaky"]
    # the step is fixed (its arguments, as a deploy would fix its code)
    await conn.execute(
        'UPDATE job_flow SET arguments = \'{"name": "flaky"}\' WHERE job_id = $1', made["flaky"]
    )
    async with transaction() as tx:
        again = await retry_workflow(tx, made.id or 0, now=clock.now())
    assert sorted(again) == sorted([made["flaky"], made["after"]])
    assert await state_of(conn, made["after"]) is JobState.WAITING
    assert await drain(handlers=step_handlers(ran)) == {"completed": 2}
    assert ran == ["ok", "flaky", "flaky", "after"]
    view = await find_workflow(conn, made.id or 0, now=clock.now())
    assert (view.state, view.succeeded) == (WorkflowState.SUCCEEDED, 3)
    assert await conn.fetchval("SELECT count(*) FROM job_dead") == 0


async def test_with_retention_off_the_counts_are_exact_and_results_are_none(
    database: Database, conn: Connection, pool_url: str
) -> None:
    ran: list[str] = []
    settings: Settings = make_settings(pool_url, retention=0)
    batch = await enqueue_batch(
        [step("x"), step("y", fail=True)], callback=Job(job_type="tally", arguments={"name": "cb"})
    )
    await drain(handlers=step_handlers(ran), settings=settings)
    assert ran[-1] == "cb"
    assert await conn.fetchval("SELECT count(*) FROM job_done") == 0
    rows = await conn.fetch(
        "SELECT outcome FROM job_flow WHERE job_id = ANY($1) ORDER BY job_id", batch.job_ids
    )
    assert [r["outcome"] for r in rows] == ["succeeded", "failed"]


async def test_ten_thousand_jobs_fan_out_in_one_enqueue_and_fan_in_to_one_callback(
    database: Database, conn: Connection
) -> None:
    jobs = [Job(job_type="step", arguments={"name": f"n{i}"}) for i in range(10_000)]
    batch = await enqueue_batch(jobs, callback=Job(job_type="tally", arguments={"name": "cb"}))
    assert len(batch.job_ids) == 10_000
    assert await conn.fetchval("SELECT count(*) FROM job") == 10_000
    assert (
        await conn.fetchval(
            "SELECT remaining FROM job_waiting WHERE job_id = $1", batch.callback_id
        )
        == 10_000
    )
