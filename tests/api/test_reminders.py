"""POST/GET /users/<id>/reminders, GET/DELETE /reminders/<id>: scheduling writes the reminder
and its `send_reminder` job in one transaction, and nothing at all on error."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from freezegun import freeze_time
from quart.typing import TestClientProtocol as Client

from jobq import statements
from jobq.db import Connection
from jobq.domain import reminders
from tests.api.conftest import RunJobs
from tests.api.helpers import assert_error, create_reminder, create_user, error_locs

T0 = datetime(2031, 3, 4, 10, 0, tzinfo=UTC)


async def counts(conn: Connection) -> tuple[int, int, int, int]:
    """(reminders, job, job_running, job_dead) row counts."""
    row = await conn.fetchrow(
        "SELECT (SELECT count(*) FROM reminders) AS r, (SELECT count(*) FROM job) AS q,"
        " (SELECT count(*) FROM job_running) AS running, (SELECT count(*) FROM job_dead) AS d"
    )
    assert row is not None
    return row["r"], row["q"], row["running"], row["d"]


async def assert_job_of(conn: Connection, reminder: dict[str, Any]) -> None:
    """The reminder's `send_reminder` job is queued, ripe at the reminder's time."""
    job = await conn.fetchrow("SELECT * FROM job WHERE id = $1", reminder["job_id"])
    assert job is not None
    assert job["job_type"] == "send_reminder"
    assert job["arguments"] == {"reminder_id": reminder["id"]}
    assert job["ripe_at"] == datetime.fromisoformat(reminder["remind_at"])
    assert job["attempts"] == 0


async def test_schedule_in_seconds(client: Client, conn: Connection) -> None:
    with freeze_time(T0, real_asyncio=True):
        user = await create_user(client)
        response = await client.post(
            f"/users/{user['id']}/reminders",
            json={"message": "  Water the plants ", "remind_in_seconds": 90},
        )
    assert response.status_code == 201
    body = await response.get_json()
    assert body["status"] == "scheduled"
    assert body["user_id"] == user["id"]
    assert body["message"] == "  Water the plants "  # kept as sent: lengths are raw lengths
    assert datetime.fromisoformat(body["remind_at"]) == T0 + timedelta(seconds=90)
    assert datetime.fromisoformat(body["created_at"]) == T0
    assert body["attempts"] == 0
    assert body["sent_at"] is None
    assert body["last_error"] is None
    assert isinstance(body["job_id"], int)
    assert await counts(conn) == (1, 1, 0, 0)
    stored = await conn.fetchrow("SELECT * FROM reminders WHERE id = $1", body["id"])
    assert stored is not None
    assert stored["remind_at"] == T0 + timedelta(seconds=90)
    assert stored["job_id"] == body["job_id"]
    await assert_job_of(conn, body)


async def test_schedule_at_a_time_with_offset(client: Client, conn: Connection) -> None:
    with freeze_time(T0, real_asyncio=True):
        user = await create_user(client)
        reminder = await create_reminder(
            client, user["id"], message="Stand-up", remind_at="2031-03-04T13:30:00+02:00"
        )
    assert reminder["status"] == "scheduled"
    assert reminder["remind_at"] == "2031-03-04T11:30:00Z"  # answered in UTC, as stored
    assert await counts(conn) == (1, 1, 0, 0)
    await assert_job_of(conn, reminder)


async def test_message_of_1000_characters_is_accepted(client: Client) -> None:
    user = await create_user(client)
    reminder = await create_reminder(client, user["id"], message="m" * 1000, remind_in_seconds=60)
    assert reminder["message"] == "m" * 1000


INVALID_REMINDERS: list[tuple[str, dict[str, Any], str | None]] = [
    ("in the past", {"message": "x", "remind_at": "2031-03-04T09:59:59+00:00"}, None),
    ("now", {"message": "x", "remind_at": "2031-03-04T10:00:00Z"}, None),
    ("naive datetime", {"message": "x", "remind_at": "2031-03-05T10:00:00"}, "remind_at"),
    ("not a datetime", {"message": "x", "remind_at": "tomorrow"}, "remind_at"),
    ("more than ten years ahead", {"message": "x", "remind_at": "2045-01-01T00:00:00Z"}, None),
    (
        "both times",
        {"message": "x", "remind_at": "2031-03-05T10:00:00Z", "remind_in_seconds": 60},
        None,
    ),
    ("neither time", {"message": "x"}, None),
    ("empty message", {"message": "", "remind_in_seconds": 60}, "message"),
    ("blank message", {"message": "   ", "remind_in_seconds": 60}, "message"),
    ("missing message", {"remind_in_seconds": 60}, "message"),
    ("message over 1000", {"message": "m" * 1001, "remind_in_seconds": 60}, "message"),
    ("NUL in message", {"message": "a\x00b", "remind_in_seconds": 60}, "message"),
    ("message not a string", {"message": 7, "remind_in_seconds": 60}, "message"),
    ("zero seconds", {"message": "x", "remind_in_seconds": 0}, "remind_in_seconds"),
    ("negative seconds", {"message": "x", "remind_in_seconds": -5}, "remind_in_seconds"),
    ("seconds too far", {"message": "x", "remind_in_seconds": 1e12}, "remind_in_seconds"),
    ("seconds not a number", {"message": "x", "remind_in_seconds": "soon"}, "remind_in_seconds"),
    ("unknown field", {"message": "x", "remind_in_seconds": 5, "urgent": True}, "urgent"),
]


@pytest.mark.parametrize(
    ("body", "field"),
    [(b, f) for _, b, f in INVALID_REMINDERS],
    ids=[i for i, _, _ in INVALID_REMINDERS],
)
async def test_invalid_reminder_is_422_and_writes_nothing(
    client: Client, conn: Connection, body: dict[str, Any], field: str | None
) -> None:
    with freeze_time(T0, real_asyncio=True):
        user = await create_user(client)
        response = await client.post(f"/users/{user['id']}/reminders", json=body)
    assert response.status_code == 422
    payload = await response.get_json()
    assert_error(payload, "validation_error")
    locs = error_locs(payload)
    if field is not None:
        assert any(field in loc for loc in locs), payload
    assert await counts(conn) == (0, 0, 0, 0)


async def test_reminder_for_unknown_user_is_404_and_writes_nothing(
    client: Client, conn: Connection
) -> None:
    user = await create_user(client)
    response = await client.post(
        f"/users/{user['id'] + 1}/reminders", json={"message": "x", "remind_in_seconds": 60}
    )
    assert response.status_code == 404
    body = await response.get_json()
    assert_error(body, "not_found")
    assert body["detail"]["user_id"] == user["id"] + 1
    assert await counts(conn) == (0, 0, 0, 0)


async def test_list_reminders_by_due_time(client: Client) -> None:
    with freeze_time(T0, real_asyncio=True):
        ann = await create_user(client)
        bob = await create_user(client, "Bob", "bob@example.com")
        later = await create_reminder(client, ann["id"], message="later", remind_in_seconds=600)
        sooner = await create_reminder(client, ann["id"], message="sooner", remind_in_seconds=60)
        await create_reminder(client, bob["id"], message="bob's", remind_in_seconds=30)
        response = await client.get(f"/users/{ann['id']}/reminders")
    assert response.status_code == 200
    body = await response.get_json()
    assert body == {"reminders": [sooner, later]}


async def test_list_reminders_of_user_without_any(client: Client) -> None:
    user = await create_user(client)
    response = await client.get(f"/users/{user['id']}/reminders")
    assert response.status_code == 200
    assert await response.get_json() == {"reminders": []}


async def test_list_reminders_of_unknown_user_is_404(client: Client) -> None:
    await create_user(client)  # whose key the client sends
    response = await client.get("/users/4242/reminders")
    assert response.status_code == 404
    assert_error(await response.get_json(), "not_found")


async def test_get_reminder(client: Client) -> None:
    user = await create_user(client)
    reminder = await create_reminder(client, user["id"], message="hello", remind_in_seconds=60)
    response = await client.get(f"/reminders/{reminder['id']}")
    assert response.status_code == 200
    assert await response.get_json() == reminder


async def test_get_unknown_reminder_is_404(client: Client) -> None:
    await create_user(client)  # whose key the client sends
    response = await client.get("/reminders/4242")
    assert response.status_code == 404
    body = await response.get_json()
    assert_error(body, "not_found")
    assert body["detail"]["reminder_id"] == 4242


async def test_delete_reminder_removes_it_and_its_job(client: Client, conn: Connection) -> None:
    user = await create_user(client)
    keep = await create_reminder(client, user["id"], message="keep", remind_in_seconds=60)
    gone = await create_reminder(client, user["id"], message="gone", remind_in_seconds=60)
    response = await client.delete(f"/reminders/{gone['id']}")
    assert response.status_code == 204
    assert await response.get_data() == b""
    assert await conn.fetchval("SELECT count(*) FROM reminders WHERE id = $1", gone["id"]) == 0
    assert await conn.fetchval("SELECT count(*) FROM job WHERE id = $1", gone["job_id"]) == 0
    # the other reminder and its job are untouched
    assert await counts(conn) == (1, 1, 0, 0)
    assert await conn.fetchval("SELECT count(*) FROM job WHERE id = $1", keep["job_id"]) == 1
    assert (await client.get(f"/reminders/{gone['id']}")).status_code == 404
    again = await client.delete(f"/reminders/{gone['id']}")
    assert again.status_code == 404


async def test_delete_unknown_reminder_is_404(client: Client, conn: Connection) -> None:
    user = await create_user(client)
    await create_reminder(client, user["id"], message="keep", remind_in_seconds=60)
    response = await client.delete("/reminders/4242")
    assert response.status_code == 404
    assert_error(await response.get_json(), "not_found")
    assert await counts(conn) == (1, 1, 0, 0)


async def test_a_reminder_read_just_before_its_delivery_ends_reads_sent(
    client: Client, conn: Connection, run_jobs: RunJobs
) -> None:
    # The rows and their jobs' states are two statements: a delivery that ends between them
    # marked its reminder sent first, so the reminder reads `sent` (its job gone), not `failed`.
    with freeze_time(T0, real_asyncio=True):
        user = await create_user(client)
        await create_reminder(client, user["id"], message="x", remind_in_seconds=60)
    [row] = await statements.reminder_list.fetch(conn, user_id=user["id"])
    assert await run_jobs(at=T0 + timedelta(seconds=61)) == 1
    [reminder] = await reminders._reminders(conn, [row])
    assert reminder.status == "sent"
    assert reminder.sent_at == T0 + timedelta(seconds=61)
    assert reminder.attempts == 1
