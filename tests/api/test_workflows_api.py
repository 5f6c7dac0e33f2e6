"""`/workflows` over HTTP: a workflow and its graph, its list, cancel and retry, a waiting job
and a running job's progress at `GET /jobs/<id>`, the metrics of waiting jobs, and the 422 of a
workflow whose steps wait for each other in a cycle (raised by the enqueue, mapped like every
`JobqError`)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel
from quart.typing import TestClientProtocol as Client

from jobq import clock
from jobq.config import Settings
from jobq.db import Connection
from jobq.errors import InvalidWorkflow
from jobq.queue import DontRetry, Job, JobContext, Registry, Workflow, enqueue_workflow
from jobq.testing import drain
from tests.api.conftest import ADMIN, ADMIN_TOKEN
from tests.conftest import make_settings


@pytest.fixture
def settings(database_url: str) -> Settings:
    """The test settings, with an admin token."""
    return make_settings(database_url, admin_token=ADMIN_TOKEN)


class Args(BaseModel):
    fail: bool = False


def handlers() -> Registry:
    registry = Registry()

    @registry.handler("step", args=Args, max_retries=0)
    async def step(args: Args, job: JobContext) -> str:
        if args.fail:
            raise DontRetry("broken")
        return "ok"

    return registry


async def call(client: Client, method: str, path: str, status: int = 200) -> Any:
    if method == "GET":
        response = await client.get(path, headers=ADMIN)
    else:
        response = await client.post(path, headers=ADMIN)
    assert response.status_code == status, await response.get_data(as_text=True)
    return await response.get_json()


def diamond(fail: bool = False) -> Workflow:
    flow = Workflow("diamond")
    a = flow.add(Job(job_type="step"), name="a")
    b = flow.add(Job(job_type="step", arguments={"fail": fail}), name="b", after=[a])
    c = flow.add(Job(job_type="step"), name="c", after=[a])
    flow.add(Job(job_type="step"), name="d", after=[b, c])
    return flow


async def test_a_workflow_is_shown_with_its_graph_and_listed(client: Client) -> None:
    made = await enqueue_workflow(diamond())
    shown = await call(client, "GET", f"/workflows/{made.id}")
    assert (shown["name"], shown["state"], shown["unfinished"]) == ("diamond", "running", 4)
    steps = {s["step"]: s for s in shown["steps"]}
    assert steps["a"]["state"] == "queued"
    assert steps["d"]["state"] == "waiting"
    assert steps["d"]["depends_on"] == [made["b"], made["c"]]
    waiting = await call(client, "GET", f"/jobs/{made['d']}")
    assert waiting["state"] == "waiting"

    assert await drain(handlers=handlers()) == {"completed": 4}
    shown = await call(client, "GET", f"/workflows/{made.id}")
    assert (shown["state"], shown["succeeded"]) == ("succeeded", 4)
    listed = await call(client, "GET", "/workflows?limit=10")
    assert [w["id"] for w in listed["workflows"]] == [made.id]
    assert listed["workflows"][0]["steps"] == []
    unfinished = await call(client, "GET", "/workflows?unfinished=true")
    assert [w["id"] for w in unfinished["workflows"]] == [made.id]  # until the pruner sees it
    await call(client, "GET", "/workflows/999", status=404)


async def test_cancel_and_retry_of_a_workflow_over_http(client: Client, conn: Connection) -> None:
    made = await enqueue_workflow(diamond(fail=True), handlers=handlers())
    await drain(handlers=handlers())
    shown = await call(client, "GET", f"/workflows/{made.id}")
    assert (shown["state"], shown["failed"], shown["cancelled"]) == ("failed", 1, 1)

    await conn.execute(
        "UPDATE job_flow SET arguments = '{}' WHERE job_id = $1", made["b"]
    )  # the fix
    retried = await call(client, "POST", f"/workflows/{made.id}/retry")
    assert sorted(retried["job_ids"]) == sorted([made["b"], made["d"]])
    cancelled = await call(client, "POST", f"/workflows/{made.id}/cancel")
    assert (cancelled["queued"], cancelled["waiting"], cancelled["running"]) == (1, 1, 0)
    shown = await call(client, "GET", f"/workflows/{made.id}")
    assert (shown["state"], shown["cancelled"]) == ("cancelled", 2)
    await call(client, "POST", "/workflows/999/cancel", status=404)
    await call(client, "POST", "/workflows/999/retry", status=404)


async def test_workflows_need_the_admin_token(client: Client) -> None:
    response = await client.get("/workflows")
    assert response.status_code == 401


async def test_a_cycle_is_refused_with_a_422_that_names_it(client: Client) -> None:
    flow = Workflow()
    flow.add(Job(job_type="step"), name="x", after=["y"])
    flow.add(Job(job_type="step"), name="y", after=["x"])
    with pytest.raises(InvalidWorkflow) as refused:
        await enqueue_workflow(flow)
    assert (refused.value.status, refused.value.code) == (422, "invalid_workflow")
    assert "cycle: x -> y -> x" in refused.value.message


async def test_the_metrics_count_waiting_jobs_and_open_workflows(client: Client) -> None:
    await enqueue_workflow(diamond())
    response = await client.get("/metrics", headers=ADMIN)
    text = await response.get_data(as_text=True)
    assert "jobq_jobs_waiting 3.0" in text
    assert "jobq_workflows_open 1.0" in text


async def test_a_running_job_shows_its_progress(client: Client, conn: Connection) -> None:
    made = await enqueue_workflow(diamond())
    await conn.execute(
        "WITH c AS (DELETE FROM job WHERE id = $1 RETURNING *)"
        " INSERT INTO job_running (id, job_type, arguments, ripe_at, priority, attempts,"
        " max_retries, created_at, unique_mode, worker_id, claimed_at, lease_expires_at, token,"
        " progress, progress_message)"
        " SELECT id, job_type, arguments, ripe_at, priority, attempts, max_retries, created_at,"
        " unique_mode, 1, $2, $2, 1, 0.25, 'a quarter' FROM c",
        made["a"],
        clock.now(),
    )  # as a claim, then a report, would
    job = await call(client, "GET", f"/jobs/{made['a']}")
    assert (job["state"], job["progress"], job["progress_message"]) == (
        "running", 0.25, "a quarter"
    )  # fmt: skip
    shown = await call(client, "GET", f"/workflows/{made.id}")
    assert {s["step"]: s["progress"] for s in shown["steps"]}["a"] == 0.25
