"""The dashboard's workflow pages: the list, a workflow's graph drawn from its jobs' states (an
inline SVG, no script, no inline style), cancel and retry from the page; and the graph's layout
(`jobq.dashboard.graph`) as a pure function."""

from __future__ import annotations

import httpx
from pydantic import BaseModel

from jobq.dashboard.graph import MAX_PER_COLUMN, depths, layout
from jobq.db import Connection
from jobq.queue import DontRetry, Job, JobContext, Registry, Workflow, enqueue_workflow
from jobq.queue.control import JobState
from jobq.queue.workflows import StepView
from jobq.testing import drain
from tests.dashboard.conftest import ADMIN, log_in


class Args(BaseModel):
    fail: bool = False


def handlers() -> Registry:
    registry = Registry()

    @registry.handler("step", args=Args, max_retries=0)
    async def step(args: Args, job: JobContext) -> None:
        if args.fail:
            raise DontRetry("broken on purpose")

    return registry


async def test_a_workflow_page_draws_its_graph_and_cancels_and_retries_it(
    http: httpx.AsyncClient, conn: Connection
) -> None:
    flow = Workflow("nightly")
    a = flow.add(Job(job_type="step"), name="extract")
    b = flow.add(Job(job_type="step", arguments={"fail": True}), name="transform", after=[a])
    flow.add(Job(job_type="step"), name="load", after=[b])
    made = await enqueue_workflow(flow, handlers=handlers())
    await drain(handlers=handlers())

    listed = (await http.get("/dashboard/workflows", headers=ADMIN)).text
    assert "nightly" in listed
    assert f"/dashboard/workflows/{made.id}" in listed
    page = await http.get(f"/dashboard/workflows/{made.id}", headers=ADMIN)
    assert page.status_code == 200
    assert "<svg" in page.text
    assert "<script>" not in page.text
    assert 'style="' not in page.text
    assert page.text.count('class="edge"') == 2
    for name, state in (("extract", "succeeded"), ("transform", "failed"), ("load", "cancelled")):
        assert f'<g class="node {state}">' in page.text
        assert f"{name} ({state})" in page.text  # the box's title

    cookie, csrf = await log_in(http)
    headers = {"Cookie": f"jobq_dashboard={cookie}", "Origin": str(http.base_url).rstrip("/")}
    await conn.execute("UPDATE job_flow SET arguments = '{}' WHERE job_id = $1", made["transform"])
    done = await http.post(
        f"/dashboard/workflows/{made.id}/retry", data={"csrf": csrf}, headers=headers
    )
    assert done.status_code == 303
    assert "retried" in done.headers["location"]
    done = await http.post(
        f"/dashboard/workflows/{made.id}/cancel", data={"csrf": csrf}, headers=headers
    )
    assert done.status_code == 303
    page = await http.get(done.headers["location"], headers=ADMIN)
    assert "cancelled: 1 waiting, 1 queued, 0 running" in page.text
    missing = await http.get("/dashboard/workflows/999", headers=ADMIN)
    assert missing.status_code == 404


def step(job_id: int, after: list[int], state: JobState = JobState.QUEUED) -> StepView:
    return StepView.model_validate(
        {
            "job_id": job_id, "step": f"s{job_id}", "job_type": "t", "queue": "default",
            "sequence_key": None, "state": state, "created_at": "2030-01-01T00:00:00Z",
            "progress": None, "progress_message": None, "cancelling": False, "depends_on": after,
        }
    )  # fmt: skip


def test_the_graph_puts_each_job_right_of_the_jobs_it_waits_for() -> None:
    steps = [step(1, []), step(2, [1]), step(3, [1]), step(4, [2, 3]), step(5, [1, 4])]
    assert depths(steps) == {1: 0, 2: 1, 3: 1, 4: 2, 5: 3}
    graph = layout(steps)
    x = {b.job_id: b.x for b in graph.boxes}
    assert x[1] < x[2] == x[3] < x[4] < x[5]
    assert len(graph.edges) == 6
    assert all(x1 < x2 for x1, _, x2, _ in graph.edges)


def test_a_wide_column_is_one_box_that_counts_its_jobs() -> None:
    legs = [
        step(10 + i, [1], JobState.SUCCEEDED if i % 2 else JobState.RUNNING)
        for i in range(MAX_PER_COLUMN + 5)
    ]
    graph = layout([step(1, [], JobState.SUCCEEDED), *legs, step(99, [leg.job_id for leg in legs])])
    assert len(graph.boxes) == 3
    (wide,) = [b for b in graph.boxes if b.job_id is None]
    assert wide.label == f"{MAX_PER_COLUMN + 5} jobs"
    assert wide.state == "running"
    assert wide.counts == {"running": 9, "succeeded": 8}
    assert len(graph.edges) == 2
