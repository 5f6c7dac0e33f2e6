"""Recurring reminders over HTTP: an RRULE in a time zone, its next occurrences across a DST
change, each occurrence delivered with its time, pause, resume and delete, and bad input."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from freezegun import freeze_time
from quart.typing import TestClientProtocol as Client

from jobq.config import Settings
from jobq.db import Connection, Database
from jobq.queue import registry
from jobq.queue.leader.schedules import enqueue_due
from tests.api.conftest import RunJobs
from tests.api.helpers import assert_error, create_reminder, create_user, error_locs
from tests.toolkit.receiver import WebhookReceiver

T0 = datetime(2026, 3, 20, 12, 0, tzinfo=UTC)  # a Friday, before Paris's spring change


async def get(client: Client, url: str) -> Any:
    response = await client.get(url)
    assert response.status_code == 200, await response.get_data(as_text=True)
    return await response.get_json()


async def test_weekly_at_nine_in_paris_shows_its_next_occurrences_across_the_dst_change(
    client: Client, conn: Connection
) -> None:
    with freeze_time(T0, real_asyncio=True):
        user = await create_user(client)
        reminder = await create_reminder(
            client,
            user["id"],
            message="Stand-up",
            remind_at="2026-03-23T09:00:00+01:00",
            recurrence={"rrule": "FREQ=WEEKLY;BYDAY=MO", "tz": "Europe/Paris", "count": 4},
        )
        assert reminder["status"] == "active"
        assert reminder["job_id"] is None
        assert reminder["recurrence"] == {
            "rrule": "FREQ=WEEKLY;BYDAY=MO",
            "tz": "Europe/Paris",
            "until": None,
            "count": 4,
        }
        # 09:00 in Paris each time: 08:00Z in winter, 07:00Z from 30 March; four in all
        assert reminder["next_occurrences"] == [
            "2026-03-23T08:00:00Z",
            "2026-03-30T07:00:00Z",
            "2026-04-06T07:00:00Z",
            "2026-04-13T07:00:00Z",
        ]
        row = await conn.fetchrow(
            "SELECT next_at, source FROM job_schedule WHERE name = $1", f"reminder:{reminder['id']}"
        )
        assert row is not None
        assert (row["source"], row["next_at"]) == (
            "reminder",
            datetime(2026, 3, 23, 8, tzinfo=UTC),
        )


async def test_each_occurrence_is_delivered_with_its_time_then_the_reminder_ends(
    client: Client,
    database: Database,
    settings: Settings,
    run_jobs: RunJobs,
    receiver: WebhookReceiver,
) -> None:
    with freeze_time(T0, real_asyncio=True) as frozen:
        user = await create_user(client, webhook_url=receiver.url)
        reminder = await create_reminder(
            client,
            user["id"],
            message="Drink water",
            remind_at=(T0 + timedelta(minutes=1)).isoformat(),
            recurrence={"rrule": "FREQ=MINUTELY;INTERVAL=2", "count": 3},
        )
        for minute in (1, 3, 5):
            at = T0 + timedelta(minutes=minute)
            frozen.move_to(at - timedelta(seconds=5))
            assert await enqueue_due(database, registry, now=at - timedelta(seconds=5)) == 1
            frozen.move_to(at)
            assert await run_jobs(at) == 1
        later = await get(client, f"/reminders/{reminder['id']}")
    bodies = [json.loads(r.body) for r in receiver.requests]
    assert [b["occurrence_at"] for b in bodies] == [
        "2026-03-20T12:01:00Z",
        "2026-03-20T12:03:00Z",
        "2026-03-20T12:05:00Z",
    ]
    assert {b["reminder_id"] for b in bodies} == {reminder["id"]}
    assert (later["status"], later["deliveries"]) == ("ended", 3)
    assert later["last_occurrence_at"] == "2026-03-20T12:05:00Z"
    assert later["next_occurrences"] == []


async def test_pause_resume_and_delete(
    client: Client, conn: Connection, database: Database
) -> None:
    with freeze_time(T0, real_asyncio=True) as frozen:
        user = await create_user(client)
        reminder = await create_reminder(
            client,
            user["id"],
            message="Stretch",
            remind_at=(T0 + timedelta(seconds=5)).isoformat(),
            recurrence={"rrule": "FREQ=HOURLY"},
        )
        url = f"/reminders/{reminder['id']}"
        assert await enqueue_due(database, registry, now=T0) == 1  # 12:00:05, queued ahead
        paused = await client.post(f"{url}/pause")
        assert paused.status_code == 200
        assert (await paused.get_json())["status"] == "paused"
        assert await conn.fetchval("SELECT count(*) FROM job") == 0  # the queued one cancelled
        cancelled = await conn.fetchval("SELECT count(*) FROM job_done WHERE state = 'cancelled'")
        assert cancelled == 1
        frozen.move_to(T0 + timedelta(hours=3, minutes=10))
        assert await enqueue_due(database, registry, now=T0 + timedelta(hours=3, minutes=10)) == 0
        resumed = await (await client.post(f"{url}/resume")).get_json()
        assert resumed["status"] == "active"
        # from the next occurrence after now: those of the pause are not made up
        assert resumed["next_occurrences"][0] == "2026-03-20T16:00:05Z"
        assert (await client.delete(url)).status_code == 204
        assert await conn.fetchval("SELECT count(*) FROM job_schedule") == 0
        assert (await client.get(url)).status_code == 404
        one_off = await create_reminder(client, user["id"], message="once", remind_in_seconds=60)
        refused = await client.post(f"/reminders/{one_off['id']}/pause")
        assert refused.status_code == 409
        assert_error(await refused.get_json(), "conflict")


@pytest.mark.parametrize(
    ("recurrence", "loc", "reason"),
    [
        ({"rrule": "FREQ=SOMETIMES"}, ("recurrence", "rrule"), "invalid RRULE"),
        ({"rrule": "FREQ=SECONDLY"}, ("recurrence", "rrule"), "once a minute"),
        ({"rrule": "FREQ=MINUTELY;BYSECOND=0,30"}, ("recurrence", "rrule"), "once a minute"),
        ({"rrule": "FREQ=DAILY;COUNT=3"}, ("recurrence", "rrule"), "COUNT"),
        ({"rrule": "FREQ=DAILY", "tz": "Mars/Olympus"}, ("recurrence", "tz"), "time zone"),
        (
            {"rrule": "FREQ=DAILY", "count": 2, "until": "2030-01-01T00:00:00Z"},
            ("recurrence",),
            "not both",
        ),
        ({"rrule": "FREQ=DAILY", "until": "2026-03-20T12:00:00Z"}, (), "until must be after"),
        ({"rrule": "FREQ=DAILY", "count": 0}, ("recurrence", "count"), "greater than"),
    ],
    ids=[
        "syntax",
        "secondly",
        "bysecond",
        "count-inside",
        "zone",
        "both-ends",
        "until-before",
        "count-0",
    ],
)
async def test_a_bad_recurrence_is_422_naming_the_field_and_writes_nothing(
    client: Client, conn: Connection, recurrence: dict[str, Any], loc: tuple[str, ...], reason: str
) -> None:
    with freeze_time(T0, real_asyncio=True):
        user = await create_user(client)
        response = await client.post(
            f"/users/{user['id']}/reminders",
            json={"message": "x", "remind_in_seconds": 60, "recurrence": recurrence},
        )
    assert response.status_code == 422
    body = await response.get_json()
    assert_error(body, "validation_error")
    assert any(found[: len(loc)] == loc for found in error_locs(body)), body
    assert reason in json.dumps(body), body
    assert await conn.fetchval("SELECT count(*) FROM reminders") == 0
    assert await conn.fetchval("SELECT count(*) FROM job_schedule") == 0
