"""The admin endpoints at work (authorised): the dead letter listed a page at a time, a dead job
retried (back in the queue, ripe now, retries reset) or discarded, and the workers with their
liveness. Who may call them is `test_security`'s part."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from freezegun import freeze_time
from pydantic import BaseModel
from quart.typing import TestClientProtocol as Client

from jobq.config import Settings
from jobq.db import Connection
from jobq.domain import reminders
from jobq.queue import Job, JobContext, Registry, Worker, enqueue
from jobq.queue.model import DEFAULT_MAX_RETRIES
from tests.api.conftest import ADMIN, ADMIN_TOKEN, RunJobs
from tests.api.helpers import assert_error, create_reminder, create_user, error_locs
from tests.conftest import make_settings
from tests.toolkit.receiver import WebhookReceiver

T0 = datetime(2031, 3, 4, 10, 0, tzinfo=UTC)
MakeWorker = Callable[..., Awaitable[Worker]]


@pytest.fixture
def settings(database_url: str) -> Settings:
    """The test settings, with an admin token."""
    return make_settings(database_url, admin_token=ADMIN_TOKEN)


async def bury(conn: Connection, job_id: int, **values: Any) -> None:
    """Insert dead job `job_id` (job type `t`, arguments `{"n": job_id}` unless given)."""
    row: dict[str, Any] = {
        "job_type": "t",
        "arguments": {"n": job_id},
        "priority": 0,
        "attempts": 6,
        "max_retries": 5,
        "last_error": f"boom {job_id}",
        "created_at": T0,
        "died_at": T0 + timedelta(minutes=job_id),
    } | values
    await conn.execute(
        "INSERT INTO job_dead (id, job_type, arguments, priority, attempts, max_retries,"
        " last_error, created_at, died_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        job_id,
        *row.values(),
    )


ADMIN_PATHS = ("/jobs/dead", "/jobs/{job_id}", "/jobs/stats", "/workers", "/queues", "/workflows")
"""The admin paths (and those below them); `/jobs` alone is one too."""


async def get_json(client: Client, url: str, status: int = 200) -> Any:
    """GET `url` (with the admin token on admin routes, else the client's user key)."""
    response = await client.get(url, headers=ADMIN if url.startswith(ADMIN_PATHS) else None)
    assert response.status_code == status, await response.get_data(as_text=True)
    return await response.get_json()


async def where(conn: Connection, job_id: int) -> list[str]:
    """The queue tables that hold job `job_id`."""
    found = await conn.fetch("SELECT state FROM job_state WHERE id = $1", job_id)
    return [r["state"] for r in found]


# -- GET /jobs/dead ----------------------------------------------------------------------------


async def test_empty_dead_letter(client: Client) -> None:
    assert await get_json(client, "/jobs/dead") == {"jobs": [], "next_after": None}


async def test_dead_jobs_are_listed_newest_first_with_their_error(
    client: Client, conn: Connection
) -> None:
    await bury(conn, 7, job_type="alpha", arguments={"to": "ann"}, priority=3, attempts=2)
    await bury(conn, 9)
    body = await get_json(client, "/jobs/dead")
    assert [j["id"] for j in body["jobs"]] == [9, 7]
    assert body["next_after"] is None
    assert body["jobs"][1] == {
        "id": 7,
        "job_type": "alpha",
        "arguments": {"to": "ann"},
        "priority": 3,
        "attempts": 2,
        "max_retries": 5,
        "last_error": "boom 7",
        "created_at": "2031-03-04T10:00:00Z",
        "died_at": "2031-03-04T10:07:00Z",
    }


async def test_dead_jobs_a_page_at_a_time(client: Client, conn: Connection) -> None:
    for job_id in range(1, 6):
        await bury(conn, job_id)
    pages = []
    url = "/jobs/dead?limit=2"
    while True:
        body = await get_json(client, url)
        pages.append([j["id"] for j in body["jobs"]])
        if body["next_after"] is None:
            break
        url = f"/jobs/dead?limit=2&after={body['next_after']}"
    assert pages == [[5, 4], [3, 2], [1]]


async def test_a_full_last_page_is_followed_by_an_empty_one(
    client: Client, conn: Connection
) -> None:
    for job_id in (1, 2):
        await bury(conn, job_id)
    first = await get_json(client, "/jobs/dead?limit=2")
    assert [j["id"] for j in first["jobs"]] == [2, 1]
    assert first["next_after"] == 1
    assert await get_json(client, "/jobs/dead?limit=2&after=1") == {"jobs": [], "next_after": None}


async def test_a_job_dying_during_paging_is_neither_lost_nor_repeated_on_later_pages(
    client: Client, conn: Connection
) -> None:
    """Keyset pages: a job buried meanwhile with a lower id than the cursor shows on a later
    page; one with a higher id (seen by the next listing from the top) does not disturb it."""
    for job_id in (2, 4, 6):
        await bury(conn, job_id)
    first = await get_json(client, "/jobs/dead?limit=1")
    assert [j["id"] for j in first["jobs"]] == [6]
    await bury(conn, 3)
    await bury(conn, 8)
    rest = await get_json(client, f"/jobs/dead?limit=10&after={first['next_after']}")
    assert [j["id"] for j in rest["jobs"]] == [4, 3, 2]


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("limit=0", "limit"),
        ("limit=501", "limit"),
        ("limit=abc", "limit"),
        ("limit=1.5", "limit"),
        ("limit=", "limit"),
        ("after=0", "after"),
        ("after=-1", "after"),
        (f"after={2**63}", "after"),
        (f"after={10**30}", "after"),
        ("after=1%3B%20DROP%20TABLE%20job_dead", "after"),
        ("after=%00", "after"),
        ("limit=1&limit=2", "limit"),
        ("sort=id", "sort"),
    ],
)
async def test_invalid_dead_letter_query_is_422(
    client: Client, conn: Connection, query: str, field: str
) -> None:
    await bury(conn, 1)
    response = await client.get(f"/jobs/dead?{query}", headers=ADMIN)
    assert response.status_code == 422
    body = await response.get_json()
    assert_error(body, "validation_error")
    assert any(field in loc for loc in error_locs(body)), body
    assert await conn.fetchval("SELECT count(*) FROM job_dead") == 1


async def test_arguments_that_fail_the_handler_model_are_listed_dead_with_the_error(
    client: Client, conn: Connection, run_jobs: RunJobs
) -> None:
    """The app's own handler: arguments its model rejects go to the dead letter at once, with
    pydantic's message, and are never retried."""
    created = await enqueue(Job(job_type="send_reminder", arguments={"reminder_id": "seven"}))
    assert await run_jobs() == 1
    assert await where(conn, created.id) == ["dead"]
    body = await get_json(client, "/jobs/dead")
    [dead] = body["jobs"]
    assert dead["id"] == created.id
    assert dead["attempts"] == 1
    assert dead["last_error"].startswith("invalid arguments")
    assert "reminder_id" in dead["last_error"]
    assert "valid integer" in dead["last_error"]
    assert await run_jobs(at=datetime.now(UTC) + timedelta(days=30)) == 0  # no retry loop


# -- POST /jobs/dead/<id>/retry ----------------------------------------------------------------


async def test_retry_puts_the_job_back_ripe_now_with_its_retries_reset(
    client: Client, conn: Connection
) -> None:
    await bury(conn, 5, job_type="alpha", arguments={"to": "ann"}, priority=2)
    now = T0 + timedelta(days=1)
    with freeze_time(now, real_asyncio=True):
        response = await client.post("/jobs/dead/5/retry", headers=ADMIN)
    assert response.status_code == 200
    assert await response.get_json() == {
        "id": 5,
        "job_type": "alpha",
        "arguments": {"to": "ann"},
        "ripe_at": "2031-03-05T10:00:00Z",
        "priority": 2,
        "attempts": 0,
        "max_retries": 5,
        "last_error": "boom 5",
        "created_at": "2031-03-04T10:00:00Z",
    }
    assert await where(conn, 5) == ["queued"]
    job = await conn.fetchrow("SELECT ripe_at, attempts FROM job WHERE id = 5")
    assert job is not None
    assert (job["ripe_at"], job["attempts"]) == (now, 0)


async def test_retried_job_runs_and_its_reminder_is_sent(
    client: Client, conn: Connection, run_jobs: RunJobs, receiver: WebhookReceiver
) -> None:
    """End to end: a reminder whose deliveries all failed is `failed`; retried by an admin it
    is `scheduled` again, and the next delivery sends it."""
    receiver.status = 500
    with freeze_time(T0, real_asyncio=True):
        user = await create_user(client, webhook_url=receiver.url)
        reminder = await create_reminder(client, user["id"], message="hi", remind_in_seconds=1)
    job_id = reminder["job_id"]
    at = T0 + timedelta(seconds=1)
    for _ in range(DEFAULT_MAX_RETRIES + 1):
        assert await run_jobs(at=at) == 1
        at += timedelta(days=1)
    failed = await (await client.get(f"/reminders/{reminder['id']}")).get_json()
    assert failed["status"] == "failed"
    assert await where(conn, job_id) == ["dead"]

    receiver.status = 200
    response = await client.post(f"/jobs/dead/{job_id}/retry", headers=ADMIN)
    assert response.status_code == 200
    again = await (await client.get(f"/reminders/{reminder['id']}")).get_json()
    assert again["status"] == "scheduled"
    assert again["attempts"] == 0
    assert "500" in again["last_error"]  # why it had failed, until it runs

    assert await run_jobs() == 1
    sent = await (await client.get(f"/reminders/{reminder['id']}")).get_json()
    assert sent["status"] == "sent"
    assert json.loads(receiver.requests[-1].body)["attempt"] == 1
    assert await where(conn, job_id) == ["succeeded"]


async def test_retry_when_an_identical_job_is_queued_is_409_and_changes_nothing(
    client: Client, conn: Connection
) -> None:
    await bury(conn, 100, job_type="alpha", arguments={"to": "ann"})
    twin = await enqueue(Job(job_type="alpha", arguments={"to": "ann"}).runs_in(hours=1))
    before = await conn.fetch("SELECT * FROM job ORDER BY id")
    response = await client.post("/jobs/dead/100/retry", headers=ADMIN)
    assert response.status_code == 409
    body = await response.get_json()
    assert_error(body, "conflict")
    assert body["detail"]["queued_job_id"] == twin.id
    assert await where(conn, 100) == ["dead"]
    assert await conn.fetch("SELECT * FROM job ORDER BY id") == before

    # once the twin is gone, the retry goes through
    await conn.execute("DELETE FROM job WHERE id = $1", twin.id)
    response = await client.post("/jobs/dead/100/retry", headers=ADMIN)
    assert response.status_code == 200
    assert await where(conn, 100) == ["queued"]


async def test_retry_of_a_job_identical_to_a_running_one_is_queued(
    client: Client, conn: Connection, make_worker: MakeWorker
) -> None:
    """As with enqueue, a running job is no duplicate: it may need to run again."""
    release = asyncio.Event()
    handlers = Registry()

    class Args(BaseModel):
        to: str

    @handlers.handler("alpha", args=Args)
    async def block(args: Args, job: JobContext) -> None:
        await release.wait()

    worker = await make_worker(handlers)
    running = await enqueue(Job(job_type="alpha", arguments={"to": "ann"}))
    assert await worker.run_once() == 1
    try:
        await bury(conn, 100, job_type="alpha", arguments={"to": "ann"})
        response = await client.post("/jobs/dead/100/retry", headers=ADMIN)
        assert response.status_code == 200
        assert await where(conn, 100) == ["queued"]
        assert await where(conn, running.id) == ["running"]
    finally:
        release.set()
        await worker.wait_idle()


@pytest.mark.parametrize("job_id", [1, 999, 2**63 - 1, 2**63])
async def test_retry_of_an_unknown_dead_job_is_404(
    client: Client, conn: Connection, job_id: int
) -> None:
    await enqueue(Job(job_type="alpha", arguments={"n": 1}))  # queued, not dead: id 1
    response = await client.post(f"/jobs/dead/{job_id}/retry", headers=ADMIN)
    assert response.status_code == 404
    assert_error(await response.get_json(), "not_found")
    assert await where(conn, 1) == ["queued"]


async def test_retry_twice_is_404_the_second_time(client: Client, conn: Connection) -> None:
    await bury(conn, 3)
    assert (await client.post("/jobs/dead/3/retry", headers=ADMIN)).status_code == 200
    response = await client.post("/jobs/dead/3/retry", headers=ADMIN)
    assert response.status_code == 404
    assert await where(conn, 3) == ["queued"]


async def test_concurrent_retries_of_one_dead_job_queue_it_once(
    client: Client, conn: Connection
) -> None:
    for job_id in range(1, 11):
        await bury(conn, job_id)
    for job_id in range(1, 11):
        responses = await asyncio.gather(
            *(client.post(f"/jobs/dead/{job_id}/retry", headers=ADMIN) for _ in range(3))
        )
        assert sorted(r.status_code for r in responses) == [200, 404, 404]
        assert await where(conn, job_id) == ["queued"]


async def test_concurrent_retry_and_discard_agree_on_the_outcome(
    client: Client, conn: Connection
) -> None:
    """The dead row is locked by whichever comes first: either the retry wins (200, then the
    discard finds nothing: 404) or the discard does (204, then the retry: 404)."""
    for job_id in range(1, 21):
        await bury(conn, job_id)
        retried, discarded = await asyncio.gather(
            client.post(f"/jobs/dead/{job_id}/retry", headers=ADMIN),
            client.delete(f"/jobs/dead/{job_id}", headers=ADMIN),
        )
        outcome = (retried.status_code, discarded.status_code)
        assert outcome in {(200, 404), (404, 204)}, outcome
        assert await where(conn, job_id) == (["queued"] if outcome == (200, 404) else [])


# -- DELETE /jobs/dead/<id> --------------------------------------------------------------------


async def test_discard_deletes_the_dead_job_for_good(client: Client, conn: Connection) -> None:
    await bury(conn, 4)
    await bury(conn, 5)
    response = await client.delete("/jobs/dead/4", headers=ADMIN)
    assert response.status_code == 204
    assert await response.get_data() == b""
    assert await where(conn, 4) == []
    assert await where(conn, 5) == ["dead"]
    again = await client.delete("/jobs/dead/4", headers=ADMIN)
    assert again.status_code == 404
    assert_error(await again.get_json(), "not_found")


async def test_discard_touches_only_the_dead_letter(client: Client, conn: Connection) -> None:
    queued = await enqueue(Job(job_type="alpha", arguments={"n": 1}))
    response = await client.delete(f"/jobs/dead/{queued.id}", headers=ADMIN)
    assert response.status_code == 404
    assert await where(conn, queued.id) == ["queued"]


# -- GET /workers ------------------------------------------------------------------------------


async def test_no_workers(client: Client) -> None:
    assert await get_json(client, "/workers") == {"workers": []}


async def test_workers_with_liveness_and_running_jobs(
    client: Client, conn: Connection, make_worker: MakeWorker
) -> None:
    release = asyncio.Event()
    handlers = Registry()

    class NoArgs(BaseModel):
        n: int

    @handlers.handler("block", args=NoArgs)
    async def block(args: NoArgs, job: JobContext) -> None:
        await release.wait()

    busy = await make_worker(handlers)
    idle = await make_worker(handlers)
    for n in (1, 2):
        await enqueue(Job(job_type="block", arguments={"n": n}))
    assert await busy.run_once() == 2
    # holding its liveness lock, a worker is alive whatever its heartbeat says
    await conn.execute(
        "UPDATE worker SET heartbeat_at = $2 WHERE id = $1",
        idle.id,
        datetime.now(UTC) - timedelta(hours=1),
    )
    # a worker whose process is gone: no liveness lock, no session, an old heartbeat
    gone_at = datetime.now(UTC) - timedelta(hours=1)
    await conn.execute(
        "INSERT INTO worker (id, host, pid, started_at, heartbeat_at)"
        " VALUES (1000, 'elsewhere', 4242, $1, $1)",
        gone_at,
    )
    try:
        body = await get_json(client, "/workers")
    finally:
        release.set()
        await busy.wait_idle()
    by_id = {w["id"]: w for w in body["workers"]}
    assert list(by_id) == sorted(by_id)
    assert set(by_id) == {busy.id, idle.id, 1000}
    assert by_id[busy.id]["alive"] is True
    assert by_id[busy.id]["running_jobs"] == 2
    assert by_id[busy.id]["host"] == socket.gethostname()
    assert by_id[busy.id]["pid"] == os.getpid()
    assert by_id[idle.id]["alive"] is True
    assert by_id[idle.id]["running_jobs"] == 0
    assert by_id[1000] == {
        "id": 1000,
        "host": "elsewhere",
        "pid": 4242,
        "started_at": gone_at.isoformat().replace("+00:00", "Z"),
        "heartbeat_at": gone_at.isoformat().replace("+00:00", "Z"),
        "alive": False,
        "running_jobs": 0,
    }


async def test_a_stopped_worker_is_no_longer_listed(
    client: Client, make_worker: MakeWorker
) -> None:
    worker = await make_worker(Registry())
    assert [w["id"] for w in (await get_json(client, "/workers"))["workers"]] == [worker.id]
    await worker.abort()
    assert await get_json(client, "/workers") == {"workers": []}


# -- the OpenAPI document ----------------------------------------------------------------------


async def test_openapi_documents_the_admin_endpoints_with_their_security(client: Client) -> None:
    spec = await (await client.get("/openapi.json")).get_json()
    assert spec["components"]["securitySchemes"] == {
        "admin_token": {"type": "http", "scheme": "bearer"},
        "api_key": {"type": "http", "scheme": "bearer"},
    }
    admin = {
        ("/jobs/dead", "get"): {200, 401, 404, 405, 408, 413, 422, 429, 500, 503},
        ("/jobs/dead/{job_id}/retry", "post"): {
            200,
            401,
            404,
            405,
            408,
            409,
            413,
            415,
            429,
            500,
            503,
        },
        ("/jobs/dead/{job_id}", "delete"): {204, 401, 404, 405, 408, 413, 429, 500, 503},
        ("/workers", "get"): {200, 401, 404, 405, 408, 413, 429, 500, 503},
        ("/jobs/stats", "get"): {200, 401, 404, 405, 408, 413, 429, 500, 503},
    }
    for (path, method), statuses in admin.items():
        operation = spec["paths"][path][method]
        assert operation["security"] == [{"admin_token": []}]
        assert set(operation["responses"]) == {str(s) for s in statuses}, (path, method)
        unauthorised = operation["responses"]["401"]
        assert unauthorised["headers"]["WWW-Authenticate"]["required"] is True
    ok = spec["paths"]["/jobs/dead"]["get"]["responses"]["200"]["content"]["application/json"]
    assert ok["schema"] == {"$ref": "#/components/schemas/DeadJobs"}
    query = {p["name"] for p in spec["paths"]["/jobs/dead"]["get"]["parameters"]}
    assert query == {"limit", "after"}


async def test_openapi_documents_every_error_with_the_error_body(client: Client) -> None:
    """Every operation documents 405, 413, 500 and 503, and each error is an `{"error",
    "detail"}` body, of the model of its status; the user-scoped operations need a user's
    key, the others none."""
    spec = await (await client.get("/openapi.json")).get_json()
    models = {404: "NotFoundError", 409: "ConflictError", 422: "ValidationFailed"}
    models |= {429: "RateLimited"}
    for name in ("Error", *models.values()):
        error = spec["components"]["schemas"][name]
        assert set(error["required"]) == {"error", "detail"}, name
        assert error["additionalProperties"] is False, name
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            responses = operation["responses"]
            assert {"405", "413", "500", "503"} <= set(responses), (path, method)
            for status, response in responses.items():
                if int(status) >= 400:
                    schema = response["content"]["application/json"]["schema"]
                    name = models.get(int(status), "Error")
                    assert schema == {"$ref": f"#/components/schemas/{name}"}, (path, status)
            if path.startswith(("/users/", "/reminders/", "/exports/")):
                assert operation["security"] == [{"api_key": []}], path
            elif not path.startswith(ADMIN_PATHS) and path != "/jobs":
                assert "security" not in operation, path
    assert set(spec["paths"]["/users"]["post"]["responses"]) == {
        "201",
        "400",
        "405",
        "408",
        "413",
        "429",
        "415",
        "422",
        "500",
        "503",
    }
    delete = spec["paths"]["/reminders/{reminder_id}"]["delete"]["responses"]
    assert set(delete) == {"204", "401", "404", "405", "408", "413", "429", "500", "503"}
    ics = spec["paths"]["/exports/{export_id}.ics"]["get"]["responses"]["200"]["content"]
    assert set(ics) == {"text/calendar"}


async def test_a_reminder_whose_dead_job_is_discarded_stays_failed(
    client: Client, conn: Connection
) -> None:
    user = await create_user(client)
    reminder = await create_reminder(client, user["id"], message="hi", remind_in_seconds=60)
    # its delivery failed for good: the job is in the dead letter
    await conn.execute(
        "WITH gone AS (DELETE FROM job WHERE id = $1 RETURNING *)"
        " INSERT INTO job_dead (id, job_type, arguments, priority, attempts, max_retries,"
        " last_error, created_at, died_at)"
        " SELECT id, job_type, arguments, priority, attempts + 1, max_retries, 'refused',"
        " created_at, created_at FROM gone",
        reminder["job_id"],
    )
    assert (await get_json(client, f"/reminders/{reminder['id']}"))["status"] == "failed"
    response = await client.delete(f"/jobs/dead/{reminder['job_id']}", headers=ADMIN)
    assert response.status_code == 204
    gone = await get_json(client, f"/reminders/{reminder['id']}")
    assert (gone["status"], gone["last_error"]) == ("failed", reminders.GONE)  # it says why
