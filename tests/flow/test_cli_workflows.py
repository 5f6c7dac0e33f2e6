"""`python -m jobq workflows` and `python -m jobq workflow ID [--cancel | --retry]` on the
session's database (run as `tests.test_cli` runs the commands): their tables, `--json`, exit
codes and changes."""

from __future__ import annotations

from jobq.db import Connection
from jobq.queue import Job, Workflow, enqueue_workflow
from tests.test_cli import Jobq, jobq

__all__ = ["jobq"]  # the fixture


async def test_workflows_are_listed_shown_cancelled_and_retried(
    jobq: Jobq, conn: Connection
) -> None:
    flow = Workflow("nightly")
    first = flow.add(Job(job_type="cli.test"), name="first")
    flow.add(Job(job_type="cli.test"), name="then", after=[first])
    made = await enqueue_workflow(flow)

    listed = await jobq("workflows")
    assert listed.code == 0, listed.err
    assert "nightly" in listed.out
    assert "running" in listed.out
    assert [w["id"] for w in (await jobq("workflows", "--json")).json()] == [made.id]

    shown = await jobq("workflow", str(made.id))
    assert shown.code == 0, shown.err
    assert "first" in shown.out
    assert "waiting" in shown.out
    steps = (await jobq("workflow", str(made.id), "--json")).json()["steps"]
    assert {s["step"]: s["state"] for s in steps} == {"first": "queued", "then": "waiting"}

    cancelled = await jobq("workflow", str(made.id), "--cancel", "--json")
    assert cancelled.code == 0, cancelled.err
    assert "'queued': 1" in cancelled.err
    assert "'waiting': 1" in cancelled.err
    assert cancelled.json()["state"] == "cancelled"
    assert await conn.fetchval("SELECT count(*) FROM job") == 0

    retried = await jobq("workflow", str(made.id), "--retry", "--json")
    assert retried.code == 0, retried.err
    assert "made again 2 jobs" in retried.err
    assert retried.json()["state"] == "running"
    assert await conn.fetchval("SELECT count(*) FROM job") == 1

    missing = await jobq("workflow", "999")
    assert missing.code == 3
    assert "no such workflow" in missing.err
