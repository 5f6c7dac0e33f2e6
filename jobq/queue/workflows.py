"""Workflows seen and steered by an operator: find, list, cancel, retry their failed steps, and
forget them after the retention. Thin verbs over `sql/queries/flow.sql` and the functions it
calls; they take the connection of the caller's transaction (`jobq.queue.flow` enqueues)."""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

import asyncpg
from pydantic import AwareDatetime, BaseModel, Field

from jobq.db import Connection
from jobq.errors import Conflict, NotFound
from jobq.queue import metrics, sql
from jobq.queue.control import JobState
from jobq.queue.wakeup import wake_workers_after_commit

MAX_STEPS = 2000
"""The most steps `find_workflow` returns by default."""


class WorkflowState(StrEnum):
    """Where a workflow stands: `running` while a job of it has not ended; then `succeeded`
    (all did), `failed` (some failed or were cancelled), or `cancelled` (it was)."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class StepView(BaseModel):
    """A job of a workflow as it is now: `state` as `GET /jobs/{id}` gives it (or, once no table
    holds the job, the outcome its dependents saw), `depends_on`: the ids of the jobs it waits
    for (the graph's edges)."""

    job_id: int
    step: str | None = Field(description="its name in the workflow (null: unnamed)")
    job_type: str
    queue: str
    sequence_key: str | None
    state: JobState
    created_at: AwareDatetime
    progress: float | None = Field(description="its last progress report while it runs")
    progress_message: str | None
    cancelling: bool = Field(description="cancelled while it runs: it ends cancelled")
    depends_on: list[int]


class WorkflowView(BaseModel):
    """A workflow: its jobs counted by the outcome their dependents saw (`unfinished`: not
    ended), and (by id, up to a limit) the jobs themselves; `more_steps`: some were left out."""

    id: int
    name: str | None
    state: WorkflowState
    num_jobs: int
    created_at: AwareDatetime
    cancelled_at: AwareDatetime | None
    finished_at: AwareDatetime | None = Field(description="when it was first seen ended")
    succeeded: int
    failed: int
    cancelled: int
    unfinished: int
    steps: list[StepView] = Field(default_factory=list, description="empty in lists")
    more_steps: bool = False


def _view(row: Any) -> WorkflowView:
    values = dict(row)
    if values["unfinished"]:
        state = WorkflowState.RUNNING
    elif values["cancelled_at"] is not None:
        state = WorkflowState.CANCELLED
    elif values["failed"] or values["cancelled"]:
        state = WorkflowState.FAILED
    else:
        state = WorkflowState.SUCCEEDED
    return WorkflowView.model_validate(values | {"state": state})


async def find_workflow(
    conn: Connection, workflow_id: int, *, now: datetime, max_steps: int = MAX_STEPS
) -> WorkflowView:
    """Return workflow `workflow_id` with its first `max_steps` jobs (by id) as they are at
    `now`. Raises: `NotFound` (never made, or forgotten after the retention)."""
    row = await sql.job_workflow_get.fetchrow(conn, workflow_id=workflow_id)
    if row is None:
        raise NotFound("no such workflow", workflow_id=workflow_id)
    rows = await sql.job_workflow_steps.fetch(
        conn, workflow_id=workflow_id, now=now, after=0, limit=max_steps + 1
    )
    view = _view(row)
    view.steps = [StepView.model_validate(dict(r)) for r in rows[:max_steps]]
    view.more_steps = len(rows) > max_steps
    return view


async def list_workflows(
    conn: Connection, *, limit: int, after: int | None = None, unfinished: bool = False
) -> list[WorkflowView]:
    """Return up to `limit` workflows with ids below `after` (None: from the newest), newest
    first, without their steps; `unfinished`: only those not seen ended."""
    rows = await sql.job_workflow_list.fetch(conn, limit=limit, after=after, unfinished=unfinished)
    return [_view(r) for r in rows]


async def cancel_workflow(conn: Connection, workflow_id: int, *, now: datetime) -> dict[str, int]:
    """Cancel every job of workflow `workflow_id` that has not ended, in the caller's
    transaction: waiting and queued ones end `cancelled` now, running ones are marked and their
    workers told (they end cancelled, and never run again: `jobq.queue.control.cancel`); the
    jobs of other workflows or sequences waiting for them are told. Return how many were
    cancelled by where they were (`waiting`, `queued`, `running`). Raises: `NotFound`."""
    rows = await sql.job_workflow_cancel.fetch(conn, workflow_id=workflow_id, now=now)
    if not rows and await sql.job_workflow_get.fetchrow(conn, workflow_id=workflow_id) is None:
        raise NotFound("no such workflow", workflow_id=workflow_id)
    metrics.count_after_commit([(r["queue"], r["job_type"]) for r in rows], "cancelled")
    counts = {"waiting": 0, "queued": 0, "running": 0}
    for r in rows:
        counts[r["was"]] += 1
    return counts


async def retry_workflow(conn: Connection, workflow_id: int, *, now: datetime) -> list[int]:
    """Run again every job of workflow `workflow_id` that failed or was cancelled, in the
    caller's transaction, with its id and a full retry budget (those that wait for another one
    made again wait again); its jobs that succeeded stay as they are. Return their ids (empty:
    nothing to retry). Workers are woken after the commit.
    Raises: `NotFound`; `Conflict` while a cancelled job of it still runs (retry once it ends).
    """
    if await sql.job_workflow_get.fetchrow(conn, workflow_id=workflow_id) is None:
        raise NotFound("no such workflow", workflow_id=workflow_id)
    try:
        async with conn.transaction():
            rows = await sql.job_workflow_retry.fetch(conn, workflow_id=workflow_id, now=now)
    except asyncpg.RaiseError as exc:
        if "jobq:cancelling" not in str(exc):
            raise
        raise Conflict(
            "a cancelled job of the workflow still runs: retry once it has ended",
            workflow_id=workflow_id,
        ) from exc
    if any(not r["waiting"] for r in rows):
        wake_workers_after_commit()
    metrics.count_after_commit([(r["queue"], r["job_type"]) for r in rows], "enqueued")
    return [r["id"] for r in rows]


async def prune_flows(
    conn: Connection, *, now: datetime, retention: timedelta, batch: int = 100
) -> int:
    """One round of the workflows' retention: stamp the workflows whose jobs have all ended
    as finished at `now`, forget those finished `retention` before `now` (`batch` at a time),
    and the sequences and jobs of sequences that have ended. Return how many rows went."""
    await sql.job_workflow_seen_finished.fetchval(conn, now=now)
    pruned = 0
    while (
        count := await sql.job_workflow_prune.fetchval(conn, cutoff=now - retention, batch=batch)
    ) > 0:
        pruned += count
        if count < batch:
            break
    while (count := await sql.job_sequence_prune.fetchval(conn, batch=batch * 50)) > 0:
        pruned += count
        if count < batch * 50:
            break
    return pruned
