"""`GET /jobs/<id>` (with `?wait=`), `POST /jobs/<id>/cancel`, a reminder's delivery cancelled
while it runs, and `GET /exports/<id>?wait=`, over HTTP with a real worker."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import BaseModel
from quart.typing import TestClientProtocol as Client

from jobq.config import Settings
from jobq.db import Connection
from jobq.queue import Job, JobContext, Registry, enqueue
from tests.api.conftest import ADMIN, ADMIN_TOKEN, RunJobs
from tests.api.helpers import assert_error, create_reminder, create_user
from tests.conftest import make_settings
from tests.queue.helpers import Gate, MakeWorker
from tests.toolkit.procs import eventually


@pytest.fixture
def settings(database_url: str) -> Settings:
    """The test settings, with an admin token."""
    return make_settings(database_url, admin_token=ADMIN_TOKEN)


class Args(BaseModel):
    n: int = 0


async def get_job(client: Client, job_id: int, query: str = "", status: int = 200) -> Any:
    response = await client.get(f"/jobs/{job_id}{query}", headers=ADMIN)
    assert response.status_code == status, await response.get_data(as_text=True)
    return await response.get_json()


async def test_a_job_is_shown_in_each_state_and_unknown_ids_are_404(
    client: Client, make_worker: MakeWorker
) -> None:
    handlers = Registry()

    @handlers.handler("t", args=Args)
    async def t(args: Args, job: JobContext) -> dict[str, int]:
        return {"double": args.n * 2}

    later = await enqueue(Job(job_type="t", arguments={"n": 1}).runs_in(hours=1))
    now = await enqueue(Job(job_type="t", arguments={"n": 2}))
    assert (await get_job(client, later.id))["state"] == "scheduled"
    queued = await get_job(client, now.id)
    assert (queued["state"], queued["attempts"], queued["queue"]) == ("queued", 0, "default")
    worker = await make_worker(handlers)
    assert await worker.run_once() == 1
    await worker.wait_idle()
    done = await get_job(client, now.id)
    assert (done["state"], done["result"], done["attempts"]) == ("succeeded", {"double": 4}, 1)
    assert done["finished_at"] is not None
    assert_error(await get_job(client, 987654, status=404), "not_found")
    # without the admin token: 401, and nothing is said about the job
    assert (await client.get(f"/jobs/{now.id}")).status_code == 401


@pytest.mark.parametrize("query", ["?wait=61", "?wait=-1", "?wait=soon", "?other=1"])
async def test_a_bad_wait_is_422(client: Client, query: str) -> None:
    created = await enqueue(Job(job_type="t", arguments={"n": 1}))
    assert_error(await get_job(client, created.id, query, status=422), "validation_error")


async def test_wait_answers_when_the_job_finishes(client: Client, make_worker: MakeWorker) -> None:
    gate = Gate()
    handlers = Registry()

    @handlers.handler("t", args=Args)
    async def t(args: Args, job: JobContext) -> int:
        await gate.enter(job.id)
        return 7

    worker = await make_worker(handlers)
    created = await enqueue(Job(job_type="t", arguments={"n": 1}))
    assert await worker.run_once() == 1
    await gate.wait_entered()
    answer = asyncio.create_task(get_job(client, created.id, "?wait=30"))
    await asyncio.sleep(0.1)
    assert not answer.done()  # the job runs: the request waits
    gate.release()
    started = time.monotonic()
    body = await asyncio.wait_for(answer, 10)
    assert (body["state"], body["result"]) == ("succeeded", 7)
    assert time.monotonic() - started < 10  # woken, not at the end of its 30 s
    # a wait that times out answers with the job as it is then
    later = await enqueue(Job(job_type="t", arguments={"n": 2}).runs_in(hours=1))
    assert (await get_job(client, later.id, "?wait=0.2"))["state"] == "scheduled"


async def test_cancel_over_http(
    client: Client, conn: Connection, make_worker: MakeWorker, caplog: pytest.LogCaptureFixture
) -> None:
    handlers = Registry()

    @handlers.handler("t", args=Args)
    async def t(args: Args, job: JobContext) -> None:
        return None

    queued = await enqueue(Job(job_type="t", arguments={"n": 1}))
    with caplog.at_level(logging.INFO, logger="jobq.audit"):
        response = await client.post(f"/jobs/{queued.id}/cancel", headers=ADMIN)
        assert response.status_code == 200
        assert await response.get_json() == {
            "id": queued.id,
            "state": "cancelled",
            "already_cancelled": False,
        }
        again = await client.post(f"/jobs/{queued.id}/cancel", headers=ADMIN)
        assert again.status_code == 200
        assert (await again.get_json())["already_cancelled"] is True
    audited = [r.getMessage() for r in caplog.records if r.name == "jobq.audit"]
    assert len(audited) == 1  # the second cancel changed nothing
    assert "action=job.cancel" in audited[0]
    assert (await get_job(client, queued.id))["state"] == "cancelled"

    finished = await enqueue(Job(job_type="t", arguments={"n": 2}))
    worker = await make_worker(handlers)
    assert await worker.run_once() == 1
    await worker.wait_idle()
    response = await client.post(f"/jobs/{finished.id}/cancel", headers=ADMIN)
    assert response.status_code == 409
    assert_error(await response.get_json(), "conflict")
    response = await client.post("/jobs/987654/cancel", headers=ADMIN)
    assert response.status_code == 404
    assert (await client.post(f"/jobs/{queued.id}/cancel")).status_code == 401


@pytest.fixture
async def hanging_webhook() -> AsyncIterator[str]:
    """A webhook URL whose server reads the request and never answers."""
    received = asyncio.Event()

    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)
        received.set()
        await asyncio.sleep(3600)

    server = await asyncio.start_server(hang, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}/hook"
    server.close()


async def test_deleting_a_reminder_cancels_its_delivery_while_it_runs(
    client: Client, conn: Connection, run_jobs: RunJobs, hanging_webhook: str
) -> None:
    user = await create_user(client, webhook_url=hanging_webhook)
    reminder = await create_reminder(client, user["id"], message="hi", remind_in_seconds=1)
    job_id = reminder["job_id"]
    await asyncio.sleep(1.1)  # due

    async def deliver() -> int:
        return await run_jobs()

    delivering = asyncio.create_task(deliver())

    async def running() -> bool:
        state: str | None = await conn.fetchval("SELECT state FROM job_state WHERE id = $1", job_id)
        return state == "running"

    await eventually(running, within=10, what="the delivery to run")
    response = await client.delete(f"/reminders/{reminder['id']}")
    assert response.status_code == 204
    # the delivery, stuck on a webhook that never answers, is cancelled (well before its
    # webhook timeout), and the job ends cancelled, never retried
    assert await asyncio.wait_for(delivering, 10) == 1
    state = await conn.fetchval("SELECT state FROM job_state WHERE id = $1", job_id)
    assert state == "cancelled"
    assert await conn.fetchval("SELECT count(*) FROM job") == 0


async def test_an_export_wait_answers_the_moment_the_file_is_ready(
    client: Client, run_jobs: RunJobs
) -> None:
    user = await create_user(client)
    await create_reminder(client, user["id"], message="hi", remind_in_seconds=600)
    response = await client.post(f"/users/{user['id']}/exports")
    export = await response.get_json()
    waiting = asyncio.create_task(client.get(f"{export['status_url']}?wait=30"))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    started = time.monotonic()
    # rounds until the worker claims the export's job, not one: on a busy machine a first
    # round can claim nothing (cause not found); the wait still answers within 10 s of the first
    await eventually(run_jobs, within=10, what="the worker to claim the export's job", every=0.05)
    answer = await asyncio.wait_for(waiting, 10)
    body = await answer.get_json()
    assert body["status"] == "done", body
    assert time.monotonic() - started < 10
    bad = await client.get(f"{export['status_url']}?wait=100")
    assert bad.status_code == 422


async def test_jobs_are_listed_newest_first_filtered_and_a_page_at_a_time(
    client: Client, make_worker: MakeWorker
) -> None:
    handlers = Registry()

    @handlers.handler("ok", args=Args)
    async def ok(args: Args, job: JobContext) -> int:
        return args.n

    @handlers.handler("bad", args=Args)
    async def bad(args: Args, job: JobContext) -> None:
        raise RuntimeError("boom")

    done = [await enqueue(Job(job_type="ok", arguments={"n": i})) for i in range(3)]
    dead = await enqueue(Job(job_type="bad", arguments={"n": 1}, max_retries=0))
    worker = await make_worker(handlers)
    assert await worker.run_once() == 4
    await worker.wait_idle()
    later = await enqueue(Job(job_type="ok", arguments={"n": 9}, queue="other").runs_in(hours=1))

    async def page(query: str) -> Any:
        response = await client.get(f"/jobs{query}", headers=ADMIN)
        assert response.status_code == 200, await response.get_data(as_text=True)
        return await response.get_json()

    everything = await page("")
    assert [j["id"] for j in everything["jobs"]] == [later.id, dead.id, *[d.id for d in done][::-1]]
    assert [j["state"] for j in everything["jobs"]][:2] == ["scheduled", "failed"]
    assert everything["next_after"] is None
    assert [j["id"] for j in (await page("?state=succeeded"))["jobs"]] == [d.id for d in done[::-1]]
    assert [j["id"] for j in (await page("?job_type=bad"))["jobs"]] == [dead.id]
    assert [j["id"] for j in (await page("?queue=other"))["jobs"]] == [later.id]
    first = await page("?limit=2")
    assert len(first["jobs"]) == 2
    rest = await page(f"?limit=2&after={first['next_after']}")
    second = await page(f"?limit=2&after={rest['next_after']}")
    seen = [j["id"] for p in (first, rest, second) for j in p["jobs"]]
    assert seen == [j["id"] for j in everything["jobs"]]
    for query in ("?state=dead", "?limit=0", "?after=0", "?colour=red"):
        response = await client.get(f"/jobs{query}", headers=ADMIN)
        assert response.status_code == 422, query
    assert (await client.get("/jobs")).status_code == 401


async def test_retry_puts_a_failed_job_back_and_refuses_the_others(
    client: Client, make_worker: MakeWorker
) -> None:
    handlers = Registry()

    @handlers.handler("bad", args=Args)
    async def bad(args: Args, job: JobContext) -> None:
        raise RuntimeError("boom")

    failed = await enqueue(Job(job_type="bad", arguments={"n": 1}, max_retries=0))
    worker = await make_worker(handlers)
    assert await worker.run_once() == 1
    await worker.wait_idle()
    queued = await enqueue(Job(job_type="bad", arguments={"n": 2}).runs_in(hours=1))
    response = await client.post(f"/jobs/{failed.id}/retry", headers=ADMIN)
    assert response.status_code == 200
    body = await response.get_json()
    assert (body["id"], body["attempts"]) == (failed.id, 0)
    assert (await get_job(client, failed.id))["state"] == "queued"
    response = await client.post(f"/jobs/{queued.id}/retry", headers=ADMIN)
    assert response.status_code == 409
    assert_error(await response.get_json(), "conflict")
    assert (await client.post("/jobs/987654/retry", headers=ADMIN)).status_code == 404


async def test_a_reminder_whose_job_an_admin_cancels_is_cancelled(client: Client) -> None:
    user = await create_user(client)
    reminder = await create_reminder(client, user["id"], message="hi", remind_in_seconds=60)
    response = await client.post(f"/jobs/{reminder['job_id']}/cancel", headers=ADMIN)
    assert response.status_code == 200
    seen = await (await client.get(f"/reminders/{reminder['id']}")).get_json()
    assert (seen["status"], seen["sent_at"], seen["deliveries"]) == ("cancelled", None, 0)
