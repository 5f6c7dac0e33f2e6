"""Admin endpoints of workflows (and batches): list them, look at one with its jobs (the graph's
nodes and edges), cancel one, run its failed steps again. Each needs the admin token, as
`jobq.api.admin`'s do; `jobq.queue.workflows` does the work."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema
from quart import Blueprint
from quart_schema import security_scheme_blueprint, validate_querystring, validate_response

from jobq import clock, db
from jobq.api.admin import SECURITY_SCHEME, admin_only
from jobq.api.audit import audit
from jobq.db import read_transaction, write_transaction
from jobq.domain.types import BIGINT_MAX
from jobq.queue import workflows
from jobq.queue.workflows import WorkflowView

bp = Blueprint("workflows", __name__)
security_scheme_blueprint(bp, [{SECURITY_SCHEME: []}])


class WorkflowsQuery(BaseModel):
    """`GET /workflows` query: `limit` (1-500, default 50), `after` (the last id of the previous
    page), `unfinished` (only those with a job not ended)."""

    model_config = ConfigDict(extra="forbid")

    limit: int = Field(default=50, ge=1, le=500)
    after: Annotated[int, Field(ge=1, le=BIGINT_MAX)] | SkipJsonSchema[None] = None
    unfinished: bool = False


class Workflows(BaseModel):
    """A page of workflows, newest first, without their steps. `next_after`: pass it as `after`
    for the next page; null on the last page."""

    workflows: list[WorkflowView]
    next_after: int | None


class WorkflowQuery(BaseModel):
    """`GET /workflows/<id>` query: `steps`, the most jobs listed (0-10,000, default 2,000; by
    id, `more_steps` tells when some were left out)."""

    model_config = ConfigDict(extra="forbid")

    steps: int = Field(default=workflows.MAX_STEPS, ge=0, le=10_000)


class CancelledWorkflow(BaseModel):
    """What a cancel did: the jobs cancelled, by where they were (running ones end cancelled
    once their workers record it)."""

    id: int
    waiting: int
    queued: int
    running: int


class RetriedWorkflow(BaseModel):
    """The jobs a retry made again (empty: none had failed or been cancelled)."""

    id: int
    job_ids: list[int]


@bp.get("/workflows")
@admin_only
@validate_querystring(WorkflowsQuery)
@validate_response(Workflows)
@read_transaction
async def list_workflows(query_args: WorkflowsQuery) -> Workflows:
    """Workflows and batches, newest first, a page at a time, each with its jobs counted by
    outcome and its state (`running`, `succeeded`, `failed`, `cancelled`)."""
    found = await workflows.list_workflows(
        db.conn(),
        limit=query_args.limit,
        after=query_args.after,
        unfinished=query_args.unfinished,
    )
    more = len(found) == query_args.limit
    return Workflows(workflows=found, next_after=found[-1].id if found and more else None)


@bp.get("/workflows/<int:workflow_id>")
@admin_only
@validate_querystring(WorkflowQuery)
@validate_response(WorkflowView)
@read_transaction
async def get_workflow(workflow_id: int, query_args: WorkflowQuery) -> WorkflowView:
    """A workflow with its jobs: each one's state, progress, and the ids of the jobs it waits
    for (the edges of its graph). 404 for an unknown one, or one forgotten after the
    retention."""
    return await workflows.find_workflow(
        db.conn(), workflow_id, now=clock.now(), max_steps=query_args.steps
    )


@bp.post("/workflows/<int:workflow_id>/cancel")
@admin_only
@validate_response(CancelledWorkflow)
@write_transaction
async def cancel_workflow(workflow_id: int) -> CancelledWorkflow:
    """Cancel every job of the workflow that has not ended: waiting and queued ones now,
    running ones as `POST /jobs/<id>/cancel` does (they never run again). The jobs of other
    workflows or sequences that wait for them are told. 404 for an unknown workflow."""
    counts = await workflows.cancel_workflow(db.conn(), workflow_id, now=clock.now())
    audit("workflow.cancel", f"workflow:{workflow_id}")
    return CancelledWorkflow(id=workflow_id, **counts)


@bp.post("/workflows/<int:workflow_id>/retry")
@admin_only
@validate_response(RetriedWorkflow)
@write_transaction
async def retry_workflow(workflow_id: int) -> RetriedWorkflow:
    """Run again every job of the workflow that failed or was cancelled (the others stay as
    they are); those that wait for a job made again wait for it again. 404 for an unknown
    workflow; 409 while a cancelled job of it still runs."""
    job_ids = await workflows.retry_workflow(db.conn(), workflow_id, now=clock.now())
    audit("workflow.retry", f"workflow:{workflow_id} ({len(job_ids)} jobs)")
    return RetriedWorkflow(id=workflow_id, job_ids=job_ids)
