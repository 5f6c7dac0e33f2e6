"""Recurrence rules cannot freeze the service: a rule that never occurs (or is too costly) is a
422 after a bounded search, done off the event loop, so `/health` answers meanwhile; reads
(a user's reminders, the dashboard) compute no occurrence lists; an `until` past what a
zone's clock can show is a 422."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from typing import Any

import httpx
import pytest
from quart.typing import TestClientProtocol as Client

from jobq import db
from jobq.app import create_app
from jobq.config import Settings
from jobq.db import Connection, Database
from jobq.queue import rrules
from tests.api.conftest import ADMIN, ADMIN_TOKEN
from tests.api.helpers import assert_error, create_reminder, create_user, error_locs
from tests.conftest import make_settings
from tests.toolkit.served import served

NEVER = {"rrule": "FREQ=DAILY;BYMONTH=2;BYMONTHDAY=30"}  # no 30 February
SPARSE = {"rrule": "FREQ=YEARLY;INTERVAL=2;BYMONTH=2;BYMONTHDAY=29"}  # every four years


@pytest.fixture
def settings(pool_url: str) -> Settings:
    return make_settings(pool_url, admin_token=ADMIN_TOKEN)


def reminder(recurrence: dict[str, Any]) -> dict[str, Any]:
    return {"message": "x", "remind_in_seconds": 60, "recurrence": recurrence}


TABLES = ("reminders", "job_schedule", "job")


async def counts(conn: Connection) -> list[int]:
    return [await conn.fetchval(f"SELECT count(*) FROM {t}") for t in TABLES]


@pytest.mark.parametrize(
    "recurrence",
    [
        NEVER,
        {"rrule": "FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=29;BYDAY=MO"},  # every 28 years: too far
        {"rrule": "FREQ=MINUTELY;BYSETPOS=2"},  # a candidate a minute, never a second one
        {"rrule": "FREQ=YEARLY;INTERVAL=11"},  # each occurrence eleven years after the last
        {"rrule": "FREQ=DAILY", "count": 50_000},  # its last occurrence: too far to find
    ],
)
async def test_a_rule_over_budget_is_422_and_writes_nothing(
    client: Client, conn: Connection, recurrence: dict[str, Any]
) -> None:
    user = await create_user(client)
    before = await counts(conn)
    started = time.monotonic()
    response = await client.post(f"/users/{user['id']}/reminders", json=reminder(recurrence))
    assert time.monotonic() - started < 5  # unbudgeted, the first case took 4.5 s
    assert response.status_code == 422
    body = await response.get_json()
    assert_error(body, "validation_error")
    assert error_locs(body) == [("recurrence",)]
    assert await counts(conn) == before


@pytest.mark.parametrize(
    "until", ["9999-12-31T23:59:59-23:59", "9999-12-31T23:59:59+14:00", "9000-01-01T00:00:00Z"]
)
async def test_an_until_past_what_a_clock_shows_is_422(
    client: Client, conn: Connection, until: str
) -> None:
    user = await create_user(client)
    recurrence = {"rrule": "FREQ=DAILY", "tz": "Pacific/Kiritimati", "until": until}
    response = await client.post(f"/users/{user['id']}/reminders", json=reminder(recurrence))
    assert response.status_code == 422
    assert error_locs(await response.get_json()) == [("recurrence", "until")]
    assert await conn.fetchval("SELECT count(*) FROM reminders") == 0


@pytest.fixture
async def http(settings: Settings, database: Database) -> AsyncIterator[httpx.AsyncClient]:
    limits = httpx.Limits(max_connections=20)
    try:
        async with (
            served(create_app(settings)) as url,
            httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client,
        ):
            yield client
    finally:
        db.bind(database)


async def test_health_answers_while_rules_that_never_occur_are_posted(
    http: httpx.AsyncClient,
) -> None:
    """Six at once froze the service for 16 s (`/health` waited 11.7 s): now each is worked
    out in the rules' thread, within its budget, and the event loop goes on. `/health` is
    timed while six valid rules are posted, then while six that never occur are: the typical
    (median) wait no longer than the first's within 100 ms (the first's median is the machine's
    own pace), and none near the freeze (a second: one slow answer on a loaded machine is
    noise, not a frozen loop)."""
    user = (await http.post("/users", json={"name": "Ann", "email": "ann@example.com"})).json()
    key = {"Authorization": f"Bearer {user['api_key']}"}
    await http.get("/health")  # the connections warm

    async def post(recurrence: dict[str, str]) -> httpx.Response:
        body = reminder(recurrence)
        return await http.post(f"/users/{user['id']}/reminders", json=body, headers=key)

    async def health_while(recurrence: dict[str, str]) -> tuple[list[int], list[float]]:
        posts = [asyncio.create_task(post(recurrence)) for _ in range(6)]
        took = []
        for _ in range(10):
            started = time.monotonic()
            assert (await http.get("/health")).status_code == 200
            took.append(time.monotonic() - started)
        return [a.status_code for a in await asyncio.gather(*posts)], sorted(took)

    statuses, control = await health_while({"rrule": "FREQ=DAILY"})
    assert statuses == [201] * 6
    statuses, took = await health_while(NEVER)
    assert statuses == [422] * 6
    assert took[len(took) // 2] < control[len(control) // 2] + 0.1, (took, control)
    assert took[-1] < 1, took


@pytest.fixture
def evaluations(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every walk of a rule's occurrences (`rrules.occurrences`) from now on."""
    walks: list[object] = []
    real = rrules.occurrences

    def counted(rule: Any, budget: rrules.Budget) -> Iterator[datetime]:
        walks.append(rule)
        return real(rule, budget)

    monkeypatch.setattr(rrules, "occurrences", counted)
    return walks


async def test_reads_compute_no_occurrence_lists(client: Client, evaluations: list[object]) -> None:
    """40 reminders recurring every 28 years made this list take 47 s and the dashboard 38.5 s:
    a list shows each one's stored next occurrence, the dashboard too; one reminder read alone
    shows its next five, worked out off the event loop."""
    user = await create_user(client)
    for n in range(40):
        await create_reminder(client, user["id"], **reminder(SPARSE) | {"message": f"m{n}"})
    evaluations.clear()
    listed = await client.get(f"/users/{user['id']}/reminders")
    assert listed.status_code == 200
    found = (await listed.get_json())["reminders"]
    assert len(found) == 40
    assert {len(r["next_occurrences"]) for r in found} == {1}
    overview = await client.get("/dashboard/", headers=ADMIN)
    assert overview.status_code == 200
    assert evaluations == []  # not one walk of a rule
    one = await (await client.get(f"/reminders/{found[0]['id']}")).get_json()
    assert [at[:4] for at in one["next_occurrences"]] == ["2028", "2032", "2036", "2040", "2044"]
    assert one["next_occurrences"][0] == found[0]["next_occurrences"][0]
