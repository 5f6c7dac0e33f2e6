"""What a user keeps, and may throw away: sent reminders and exports can be deleted, and the
exports' count and bytes are capped per user (`JOBQ_MAX_EXPORTS_PER_USER`,
`JOBQ_MAX_EXPORT_BYTES_PER_USER`), at the request and at the render."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from freezegun import freeze_time
from quart import Quart
from quart.typing import TestClientProtocol as Client

from jobq import db
from jobq.app import create_app
from jobq.config import Settings
from jobq.db import Connection, Database
from tests.api.conftest import RunJobs
from tests.api.helpers import JSON, assert_error, create_reminder, create_user
from tests.conftest import make_settings
from tests.keyed_client import use_keyed_client

T0 = datetime(2031, 3, 4, 10, 0, tzinfo=UTC)
CAP = 4096
"""The tests' cap of a user's export bytes."""


@pytest.fixture
def settings(pool_url: str) -> Settings:
    return make_settings(pool_url, max_exports_per_user=3, max_export_bytes_per_user=CAP)


async def export(client: Client, user_id: int) -> JSON:
    response = await client.post(f"/users/{user_id}/exports")
    assert response.status_code == 202, await response.get_data(as_text=True)
    body: JSON = await response.get_json()
    return body


async def status(client: Client, export_id: int) -> JSON:
    body: JSON = await (await client.get(f"/exports/{export_id}")).get_json()
    return body


async def test_a_sent_reminder_can_be_deleted(
    client: Client, conn: Connection, run_jobs: RunJobs
) -> None:
    with freeze_time(T0, real_asyncio=True):
        user = await create_user(client)
        reminder = await create_reminder(client, user["id"], message="x", remind_in_seconds=60)
    assert await run_jobs(at=T0 + timedelta(seconds=61)) == 1
    assert (await client.get(f"/reminders/{reminder['id']}")).status_code == 200
    response = await client.delete(f"/reminders/{reminder['id']}")
    assert response.status_code == 204
    assert (await client.get(f"/reminders/{reminder['id']}")).status_code == 404
    assert await conn.fetchval("SELECT count(*) FROM reminders") == 0
    assert await conn.fetchval("SELECT state FROM job_state") == "succeeded"  # untouched
    again = await client.delete(f"/reminders/{reminder['id']}")
    assert again.status_code == 404


async def test_an_export_can_be_deleted_done_or_pending(
    client: Client, conn: Connection, run_jobs: RunJobs
) -> None:
    user = await create_user(client)
    await create_reminder(client, user["id"], message="x", remind_in_seconds=60)
    done = await export(client, user["id"])
    assert await run_jobs() == 1
    assert (await status(client, done["id"]))["status"] == "done"
    pending = await export(client, user["id"])
    for gone in (done, pending):
        response = await client.delete(f"/exports/{gone['id']}")
        assert response.status_code == 204
        assert (await client.get(f"/exports/{gone['id']}")).status_code == 404
        assert (await client.get(f"/exports/{gone['id']}.ics")).status_code == 404
    assert await conn.fetchval("SELECT count(*) FROM exports") == 0
    states = await conn.fetch(
        "SELECT id, state FROM job_state WHERE id = ANY($1) ORDER BY id",
        [done["job_id"], pending["job_id"]],
    )
    assert [(r["id"], r["state"]) for r in states] == [
        (done["job_id"], "succeeded"),
        (pending["job_id"], "cancelled"),  # its job is cancelled with it
    ]
    assert await run_jobs() == 0
    other = await create_user(client, "Bob", "bob@example.com")
    mine = await export(client, other["id"])
    client.key = user["api_key"]  # type: ignore[attr-defined]
    response = await client.delete(f"/exports/{mine['id']}")  # not Ann's: as if missing
    assert response.status_code == 404
    assert await conn.fetchval("SELECT count(*) FROM exports") == 1


async def test_deleting_exports_frees_their_count(client: Client) -> None:
    user = await create_user(client)
    made = [await export(client, user["id"]) for _ in range(3)]
    refused = await client.post(f"/users/{user['id']}/exports")
    assert refused.status_code == 409
    body = await refused.get_json()
    assert_error(body, "limit_reached")
    assert (body["detail"]["limit"], body["detail"]["resource"]) == (3, "exports")
    assert (await client.delete(f"/exports/{made[0]['id']}")).status_code == 204
    await export(client, user["id"])


@pytest.fixture
async def strict_client(pool_url: str, database: Database, client: Client) -> AsyncIterator[Client]:
    """A client of a second app on the same database, whose byte cap is half the first's."""
    app: Quart = create_app(make_settings(pool_url, max_export_bytes_per_user=CAP // 2))
    use_keyed_client(app)
    async with app.test_app() as test_app:
        yield test_app.test_client()
    db.bind(database)


async def test_the_export_bytes_of_a_user_are_capped(
    client: Client, strict_client: Client, conn: Connection, run_jobs: RunJobs
) -> None:
    user = await create_user(client)
    for n in range(18):  # about 150 bytes of iCalendar each
        await create_reminder(client, user["id"], message=f"m{n}" * 20, remind_in_seconds=600)
    first = await export(client, user["id"])
    assert await run_jobs() == 1
    size = await conn.fetchval("SELECT octet_length(content) FROM exports")
    assert CAP // 2 < size < CAP  # one fits; two do not
    second = await export(client, user["id"])  # requested: the files take less than the cap
    assert await run_jobs() == 1
    failed = await status(client, second["id"])
    assert failed["status"] == "failed"  # rendered, but over the cap: not stored
    assert f"may take {CAP - size} more" in failed["last_error"]
    assert await conn.fetchval("SELECT count(*) FROM exports WHERE content IS NOT NULL") == 1

    strict_client.key = user["api_key"]  # type: ignore[attr-defined]
    refused = await strict_client.post(f"/users/{user['id']}/exports")  # files over its cap
    assert refused.status_code == 409
    detail = (await refused.get_json())["detail"]
    assert (detail["limit"], detail["resource"]) == (CAP // 2, "export_bytes")
    assert (await client.delete(f"/exports/{first['id']}")).status_code == 204
    assert (await strict_client.post(f"/users/{user['id']}/exports")).status_code == 202
