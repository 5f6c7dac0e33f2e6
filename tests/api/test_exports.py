"""POST /users/<id>/exports, GET /exports/<id> and /exports/<id>.ics: an iCalendar file
rendered by the `render_export` job in the worker's thread pool."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from freezegun import freeze_time
from icalendar import Calendar
from quart.typing import TestClientProtocol as Client

from jobq.db import Connection
from tests.api.conftest import RunJobs
from tests.api.helpers import JSON, act_as, assert_error, create_reminder, create_user

T0 = datetime(2031, 3, 4, 10, 0, tzinfo=UTC)
CALENDAR = "text/calendar"


async def request_export(client: Client, user_id: int) -> JSON:
    response = await client.post(f"/users/{user_id}/exports")
    assert response.status_code == 202, await response.get_data(as_text=True)
    body: JSON = await response.get_json()
    assert response.headers["Location"] == body["status_url"]
    return body


def events(text: str) -> list[Any]:
    calendar = Calendar.from_ical(text)
    return [c for c in calendar.walk() if c.name == "VEVENT"]


async def test_request_export_is_202_pending(client: Client, conn: Connection) -> None:
    user = await create_user(client)
    response = await client.post(f"/users/{user['id']}/exports")
    assert response.status_code == 202
    body = await response.get_json()
    assert body["status"] == "pending"
    assert body["user_id"] == user["id"]
    assert body["status_url"] == f"/exports/{body['id']}"
    assert response.headers["Location"] == f"/exports/{body['id']}"
    assert body["download_url"] is None
    assert body["finished_at"] is None
    assert body["last_error"] is None
    job = await conn.fetchrow("SELECT * FROM job WHERE id = $1", body["job_id"])
    assert job is not None
    assert job["job_type"] == "render_export"
    assert job["arguments"] == {"export_id": body["id"]}
    assert await conn.fetchval("SELECT count(*) FROM exports") == 1

    status = await client.get(body["status_url"])
    assert status.status_code == 200
    assert await status.get_json() == body


async def test_export_renders_one_event_per_reminder(
    client: Client, conn: Connection, run_jobs: RunJobs
) -> None:
    messages = ["Buy milk", "Pay rent, today; really", "Café ☕ at 5"]
    with freeze_time(T0, real_asyncio=True):
        user = await create_user(client, "Ann O'Neil")
        other = await create_user(client, "Bob", "bob@example.com")
        for i, message in enumerate(messages):
            await create_reminder(
                client, user["id"], message=message, remind_in_seconds=60 * (i + 1)
            )
        await create_reminder(client, other["id"], message="Not Ann's", remind_in_seconds=60)
    act_as(client, user)  # Ann again
    export = await request_export(client, user["id"])

    # before the job has run: pending, and the file is not there yet
    early = await client.get(f"/exports/{export['id']}.ics")
    assert early.status_code == 409
    assert_error(await early.get_json(), "conflict")
    early = await client.get(f"/exports/{export['id']}", headers={"Accept": CALENDAR})
    assert early.status_code == 303  # to the file, which answers 409 until done
    assert early.headers["Location"].endswith(f"/exports/{export['id']}.ics")

    assert await run_jobs() == 1
    response = await client.get(export["status_url"])
    assert response.status_code == 200
    done = await response.get_json()
    assert done["status"] == "done"
    assert done["download_url"] == f"/exports/{export['id']}.ics"
    assert done["finished_at"] is not None
    assert await conn.fetchval("SELECT count(*) FROM job WHERE id = $1", export["job_id"]) == 0
    assert await conn.fetchval("SELECT count(*) FROM job_dead") == 0
    # the reminders' own jobs are not touched
    assert await conn.fetchval("SELECT count(*) FROM job WHERE job_type = 'send_reminder'") == 4

    download = await client.get(done["download_url"])
    assert download.status_code == 200
    assert download.mimetype == CALENDAR
    text = await download.get_data(as_text=True)
    assert text.startswith("BEGIN:VCALENDAR")
    assert text.count("BEGIN:VEVENT") == len(messages)
    assert "SUMMARY:Buy milk" in text
    found = events(text)
    assert [str(e["SUMMARY"]) for e in found] == messages
    assert [e.decoded("DTSTART") for e in found] == [
        T0 + timedelta(seconds=60 * (i + 1)) for i in range(len(messages))
    ]
    assert "Not Ann's" not in text

    negotiated = await client.get(export["status_url"], headers={"Accept": CALENDAR})
    assert negotiated.status_code == 303
    assert negotiated.headers["Location"].endswith(done["download_url"])

    # JSON stays the default
    as_json = await client.get(export["status_url"], headers={"Accept": "application/json"})
    assert as_json.status_code == 200
    assert (await as_json.get_json())["status"] == "done"


async def test_export_of_user_without_reminders(client: Client, run_jobs: RunJobs) -> None:
    user = await create_user(client)
    export = await request_export(client, user["id"])
    assert await run_jobs() == 1
    response = await client.get(f"/exports/{export['id']}.ics")
    assert response.status_code == 200
    text = await response.get_data(as_text=True)
    assert "BEGIN:VCALENDAR" in text
    assert "BEGIN:VEVENT" not in text


async def test_unknown_export_is_404(client: Client) -> None:
    await create_user(client)  # whose key the client sends
    for path, headers in [
        ("/exports/4242", {}),
        ("/exports/4242.ics", {}),
        ("/exports/4242", {"Accept": CALENDAR}),
    ]:
        response = await client.get(path, headers=headers)
        assert response.status_code == 404, path
        body = await response.get_json()
        assert_error(body, "not_found")
        assert body["detail"]["export_id"] == 4242


async def test_export_of_unknown_user_is_404_and_writes_nothing(
    client: Client, conn: Connection
) -> None:
    await create_user(client)  # whose key the client sends
    response = await client.post("/users/4242/exports")
    assert response.status_code == 404
    assert_error(await response.get_json(), "not_found")
    assert await conn.fetchval("SELECT count(*) FROM exports") == 0
    assert await conn.fetchval("SELECT count(*) FROM job") == 0
