"""Workflows, batches and sequences: jobs that wait for other jobs.

A `Workflow` is a set of jobs enqueued together, in the caller's transaction, each naming the
jobs of the workflow it waits for (a directed acyclic graph). A job waits in `job_waiting`, out
of the claim's way, until every job it waits for has ended; the statement that records the
last one's end moves it into `job` in the same transaction (the trigger on `job_running`,
`sql/functions/job_flow_ran.sql`). When one of them fails or is cancelled, it is cancelled too,
unless it was added with `on_dependency_failure="run"`.

A batch (`enqueue_batch`) is a workflow of many jobs and a callback that waits for all of them
whatever their outcome: it is enqueued exactly once, when the last one ends, and reads their
outcomes and results with `dependencies`. A sequence (`enqueue_in_sequence`, or `sequence=` on
`Workflow.add`) is a key whose jobs run one at a time in enqueue order: each waits for the one
enqueued before it with the key, whatever its outcome (a retrying job holds its sequence).

Admin verbs (find, list, cancel, retry a workflow) are in `jobq.queue.workflows`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from jobq import clock, tracing
from jobq.db import conn as current_conn
from jobq.db import current_database, json_arg, write_transaction
from jobq.errors import InvalidWorkflow
from jobq.queue import metrics, sql
from jobq.queue.model import Job
from jobq.queue.registry import Registry, registry
from jobq.queue.store import max_retries_of, queue_of
from jobq.queue.wakeup import wake_workers_after_commit

OnDependencyFailure = Literal["cancel", "run"]
"""What a job does when a job it waits for fails or is cancelled: be cancelled too (`cancel`,
the default), or run anyway once all have ended (`run`)."""

MAX_JOBS = 100_000
"""The most jobs one enqueue takes."""


@dataclass(frozen=True, slots=True)
class Step:
    """A job added to a `Workflow`: its position in it (0 first) and its name (None: unnamed).
    Pass it to `Workflow.add(after=...)`, or index an `EnqueuedWorkflow` with it."""

    index: int
    name: str | None


@dataclass
class _Entry:
    job: Job
    name: str | None
    after: list[Step | str]
    cancels: bool
    sequence: str | None


class Workflow:
    """Jobs enqueued together, each waiting for the jobs it names (`enqueue_workflow`).

    `name` (1-200 characters; None: none) is for people (the dashboard, `python -m jobq
    workflows`). Add jobs with `add`; a job may name steps added later, and the check for
    unknown names and cycles happens at the enqueue.
    """

    def __init__(self, name: str | None = None) -> None:
        if name is not None and not 1 <= len(name) <= 200:
            raise InvalidWorkflow("a workflow's name has 1 to 200 characters")
        self.name = name
        self._entries: list[_Entry] = []
        self._names: dict[str, int] = {}

    def add(
        self,
        job: Job,
        *,
        name: str | None = None,
        after: Iterable[Step | str] = (),
        on_dependency_failure: OnDependencyFailure = "cancel",
        sequence: str | None = None,
    ) -> Step:
        """Add `job`, to start once every job of `after` (steps or their names) has succeeded;
        return its step. `name`: unique in the workflow (1-200 characters). With
        `on_dependency_failure="run"` it runs once all have ended, whatever their outcome.
        `sequence`: a key (1-200 characters) whose jobs run one at a time in enqueue order.
        Jobs of a workflow are never deduplicated (their `unique` must be None or
        `ALLOW_DUPLICATES`).
        Raises: `InvalidWorkflow` for a name used twice, a bad key, or a `unique` job.
        """
        if job.unique is not None and job.unique.among != "none":
            raise InvalidWorkflow("the jobs of a workflow are never deduplicated: drop `unique`")
        if name is not None:
            if not 1 <= len(name) <= 200:
                raise InvalidWorkflow("a step's name has 1 to 200 characters", step=name)
            if name in self._names:
                raise InvalidWorkflow(f"two steps are named {name!r}", step=name)
            self._names[name] = len(self._entries)
        if sequence is not None and not 1 <= len(sequence) <= 200:
            raise InvalidWorkflow("a sequence key has 1 to 200 characters", sequence=sequence)
        entry = _Entry(job, name, list(after), on_dependency_failure == "cancel", sequence)
        self._entries.append(entry)
        return Step(len(self._entries) - 1, name)

    def __len__(self) -> int:
        return len(self._entries)

    def edges(self) -> list[tuple[int, int]]:
        """Every (job, job it waits for) pair, as positions (0 first).
        Raises: `InvalidWorkflow` for an unknown step, or steps that wait for each other in a
        cycle (the message shows it: `a -> b -> a`)."""
        pairs = {
            (index, self._position(dep, index))
            for index, entry in enumerate(self._entries)
            for dep in entry.after
        }
        self._refuse_cycles(pairs)
        return sorted(pairs)

    def _position(self, dep: Step | str, index: int) -> int:
        """The position of the step `dep` that job `index` waits for."""
        if isinstance(dep, Step):
            if 0 <= dep.index < len(self._entries) and self._entries[dep.index].name == dep.name:
                return dep.index
            raise InvalidWorkflow(f"step {self._label(index)} waits for a step of another workflow")
        if dep not in self._names:
            raise InvalidWorkflow(
                f"step {self._label(index)} waits for {dep!r}, which the workflow does not have",
                step=dep,
            )
        return self._names[dep]

    def _label(self, index: int) -> str:
        name = self._entries[index].name
        return repr(name) if name else f"job {index}"

    def _refuse_cycles(self, pairs: set[tuple[int, int]]) -> None:
        """Kahn's algorithm: peel off the jobs that no job left waits for; each job left then
        has a waiter left, so following waiters from any of them comes back to one: a cycle,
        named in the message."""
        waiters: dict[int, set[int]] = {i: set() for i in range(len(self._entries))}
        deps: dict[int, set[int]] = {i: set() for i in waiters}
        for job, dep in pairs:
            waiters[dep].add(job)
            deps[job].add(dep)
        unpeeled = {i: len(waiters[i]) for i in waiters}
        free = [i for i, n in unpeeled.items() if n == 0]
        left = set(waiters)
        while free:
            i = free.pop()
            left.discard(i)
            for dep in deps[i]:
                unpeeled[dep] -= 1
                if unpeeled[dep] == 0:
                    free.append(dep)
        if not left:
            return
        path = [min(left)]
        while path.count(path[-1]) < 2:
            path.append(min(w for w in waiters[path[-1]] if w in left))
        cycle = list(reversed(path[path.index(path[-1]) :]))
        label = [self._entries[i].name or f"job {i}" for i in cycle]
        raise InvalidWorkflow(
            "the steps wait for each other in a cycle: " + " -> ".join(label), cycle=label
        )

    def __iter__(self) -> Iterator[tuple[Job, str | None, bool, str | None]]:
        for e in self._entries:
            yield e.job, e.name, e.cancels, e.sequence


@dataclass(frozen=True)
class EnqueuedWorkflow:
    """What `enqueue_workflow` made: the workflow's `id` (None for sequences enqueued alone),
    each job's id in the order added (`job_ids`), and how many wait (`num_waiting`)."""

    id: int | None
    job_ids: list[int]
    num_waiting: int
    names: dict[str, int] = field(default_factory=dict)

    def __getitem__(self, step: Step | str) -> int:
        """The id of the job of `step` (a `Step`, or a name). Raises: `KeyError`."""
        if isinstance(step, Step):
            return self.job_ids[step.index]
        return self.job_ids[self.names[step]]


@write_transaction
async def enqueue_workflow(
    workflow: Workflow, *, handlers: Registry = registry, new_workflow: bool = True
) -> EnqueuedWorkflow:
    """Enqueue every job of `workflow` in one statement, in the transaction in progress (or
    one of its own): the jobs that wait for none go into the queue, the others wait. Workers are
    woken after the commit. A job names no `queue` or `max_retries`: its handler's, as
    `enqueue` does. `new_workflow` False: the jobs form no workflow (`enqueue_in_sequence`).

    Raises: `InvalidWorkflow` (empty, too big, an unknown step, a cycle), before any write;
    `asyncpg.PostgresError` on database errors.
    """
    jobs = list(workflow)
    if not jobs:
        raise InvalidWorkflow("the workflow has no job")
    if len(jobs) > MAX_JOBS:
        raise InvalidWorkflow(f"a workflow has at most {MAX_JOBS} jobs", num_jobs=len(jobs))
    edges = workflow.edges()
    queues = [queue_of(job, handlers) for job, *_ in jobs]
    conn = current_conn()
    now = clock.now()
    row = await sql.job_flow_enqueue.fetchrow(
        conn,
        workflow_name=workflow.name,
        new_workflow=new_workflow,
        now=now,
        job_types=[job.job_type for job, *_ in jobs],
        arguments=[json_arg(job.arguments) for job, *_ in jobs],
        ripe_ats=[job.ripe_at for job, *_ in jobs],
        priorities=[job.priority for job, *_ in jobs],
        max_retries=[max_retries_of(job, handlers) for job, *_ in jobs],
        queues=queues,
        concurrency_keys=[job.concurrency_key for job, *_ in jobs],
        steps=[name for _, name, _, _ in jobs],
        sequence_keys=[sequence for *_, sequence in jobs],
        cancels=[cancels for _, _, cancels, _ in jobs],
        edge_jobs=[job + 1 for job, _ in edges],
        edge_deps=[dep + 1 for _, dep in edges],
    )
    ids: list[int] = list(row["job_ids"])
    if row["num_waiting"] < len(ids):
        wake_workers_after_commit()
    metrics.count_after_commit(
        [(queue, job.job_type) for queue, (job, *_) in zip(queues, jobs, strict=True)], "enqueued"
    )
    await tracing.remember(conn, ids, now=now)
    names = {name: i for i, (_, name, _, _) in enumerate(jobs) if name is not None}
    return EnqueuedWorkflow(row["workflow_id"], ids, row["num_waiting"], names)


@dataclass(frozen=True)
class EnqueuedBatch:
    """What `enqueue_batch` made: the batch's workflow `id`, its jobs' ids in order, and its
    callback's (None: no callback)."""

    id: int
    job_ids: list[int]
    callback_id: int | None


async def enqueue_batch(
    jobs: Iterable[Job],
    *,
    callback: Job | None = None,
    name: str | None = None,
    handlers: Registry = registry,
) -> EnqueuedBatch:
    """Enqueue `jobs` as one workflow, all in one statement (10,000 jobs take well under a
    second), in the transaction in progress (or one of its own); `callback`, if any, is
    enqueued exactly once when every job has ended, whatever the outcomes: it reads their
    counts and results with `dependencies(job.id)`.
    Raises: as `enqueue_workflow`."""
    workflow = Workflow(name)
    steps = [workflow.add(job) for job in jobs]
    if callback is not None:
        workflow.add(callback, name="callback", after=steps, on_dependency_failure="run")
    made = await enqueue_workflow(workflow, handlers=handlers)
    assert made.id is not None
    if callback is None:
        return EnqueuedBatch(made.id, made.job_ids, None)
    return EnqueuedBatch(made.id, made.job_ids[:-1], made.job_ids[-1])


async def enqueue_in_sequence(key: str, job: Job, *, handlers: Registry = registry) -> int:
    """Enqueue `job` in sequence `key` (1-200 characters), in the transaction in progress (or
    one of its own), and return its id: it starts only after the job enqueued before it with
    that key has ended (succeeded, failed for good, or cancelled). Jobs of other keys are never
    held back. An enqueue holds the key until its transaction ends: keep it short.
    Raises: `InvalidWorkflow` for a bad key or a `unique` job; `asyncpg.PostgresError`."""
    workflow = Workflow()
    workflow.add(job, sequence=key)
    made = await enqueue_workflow(workflow, handlers=handlers, new_workflow=False)
    return made.job_ids[0]


class Dependency(BaseModel):
    """A job that a job waits (or waited) for: its id, step name, job type, the outcome its
    dependents saw (`succeeded`, `failed`, `cancelled`; None: not ended) and its `result` when
    it succeeded (None once job_done no longer keeps it: with retention off, always)."""

    job_id: int
    step: str | None
    job_type: str | None
    outcome: Literal["succeeded", "failed", "cancelled"] | None
    result: Any = None


class Dependencies(BaseModel):
    """The jobs a job waits for (`jobs`, by id), counted by outcome."""

    jobs: list[Dependency]

    @property
    def succeeded(self) -> int:
        """How many succeeded."""
        return sum(d.outcome == "succeeded" for d in self.jobs)

    @property
    def failed(self) -> int:
        """How many failed (they are in the dead letter)."""
        return sum(d.outcome == "failed" for d in self.jobs)

    @property
    def cancelled(self) -> int:
        """How many were cancelled."""
        return sum(d.outcome == "cancelled" for d in self.jobs)

    def results(self) -> dict[str, Any]:
        """The results of the named steps that succeeded, by name."""
        return {d.step: d.result for d in self.jobs if d.step and d.outcome == "succeeded"}

    def __getitem__(self, step: str) -> Dependency:
        """The dependency named `step`. Raises: `KeyError`."""
        for d in self.jobs:
            if d.step == step:
                return d
        raise KeyError(step)


async def dependencies(job_id: int) -> Dependencies:
    """Return the jobs that job `job_id` waits (or waited) for, with their outcomes and
    results: a handler's view of its inputs (`await dependencies(job.id)`; from a synchronous
    handler, `job.run_coroutine(dependencies(job.id))`). Runs alone on a pooled connection of
    the bound database."""
    async with current_database().pool.acquire() as conn:
        rows = await sql.job_flow_dependencies.fetch(conn, job_id=job_id)
    return Dependencies(jobs=[Dependency.model_validate(dict(r)) for r in rows])
