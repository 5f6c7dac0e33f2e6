"""The dashboard's workflow pages: `/dashboard/workflows` (the workflows and batches, newest
first) and `/dashboard/workflows/<id>` (its graph drawn from its jobs' states, refreshed live
like every page, its jobs, and cancel and retry). Routes of `jobq.dashboard.views.bp`; the
graph is `jobq.dashboard.graph`'s, an inline SVG styled by `dashboard.css` (no script)."""

from __future__ import annotations

from quart import Response, request
from quart_schema import hide

from jobq import clock, db
from jobq.api.audit import audit
from jobq.dashboard import graph, session
from jobq.dashboard.views import PAGE_SIZE, _back, _page, bp
from jobq.domain.types import parse_id
from jobq.errors import Conflict, NotFound
from jobq.queue import workflows

MAX_DRAWN = 500
"""The most jobs a workflow's page reads (and draws) at once."""


@bp.get("/workflows")
@hide
@session.login_only
async def workflow_list() -> Response:
    """The workflows and batches, newest first, `PAGE_SIZE` at a time (`after`: the last id of
    the page before), with their jobs counted by outcome; `unfinished=1`: only those not
    ended."""
    after_id = parse_id(request.args.get("after", ""))
    unfinished = request.args.get("unfinished") == "1"
    async with db.transaction(readonly=True) as conn:
        found = await workflows.list_workflows(
            conn, limit=PAGE_SIZE, after=after_id, unfinished=unfinished
        )
    return await _page(
        "workflows.html",
        workflows=found,
        unfinished=unfinished,
        next_after=found[-1].id if len(found) == PAGE_SIZE else None,
        done=request.args.get("done"),
    )


@bp.get("/workflows/<int:workflow_id>")
@hide
@session.login_only
async def workflow(workflow_id: int) -> Response:
    """One workflow: its state and counts, its graph, its jobs (the first `MAX_DRAWN`)."""
    try:
        async with db.transaction(readonly=True) as conn:
            view = await workflows.find_workflow(
                conn, workflow_id, now=clock.now(), max_steps=MAX_DRAWN
            )
    except NotFound:
        return await _page(
            "workflow.html", status=404, flow=None, workflow_id=workflow_id, done=None
        )
    return await _page(
        "workflow.html",
        flow=view,
        graph=graph.layout(view.steps),
        box=(graph.BOX_W, graph.BOX_H),
        workflow_id=workflow_id,
        done=request.args.get("done"),
    )


@bp.post("/workflows/<int:workflow_id>/<any(cancel, retry):verb>")
@hide
@session.login_only
async def workflow_action(workflow_id: int, verb: str) -> Response:
    """Cancel every job of the workflow not ended, or run its failed ones again; when that
    cannot be done, the page says why."""
    now = clock.now()
    try:
        async with db.transaction() as conn:
            if verb == "cancel":
                counts = await workflows.cancel_workflow(conn, workflow_id, now=now)
                message = "cancelled: " + ", ".join(f"{n} {w}" for w, n in counts.items())
            else:
                again = await workflows.retry_workflow(conn, workflow_id, now=now)
                message = f"retried: {len(again)} job{'s' * (len(again) != 1)}"
    except (Conflict, NotFound) as exc:
        return _back("dashboard.workflow", workflow_id=workflow_id, done=f"not done: {exc.message}")
    audit(f"workflow.{verb}", f"workflow:{workflow_id}")
    return _back("dashboard.workflow", workflow_id=workflow_id, done=message)
