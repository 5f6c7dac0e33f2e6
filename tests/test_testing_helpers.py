"""`jobq.testing`: `drain` and `advance` run real jobs on a frozen clock, `assert_enqueued` and
its kin read the queue, against the real database; and the README's example of them runs as
written."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from freezegun import freeze_time
from pydantic import BaseModel
from quart.typing import TestClientProtocol as Client

from jobq import clock
from jobq.config import PROJECT_ROOT, Settings
from jobq.db import Connection, Database, transaction
from jobq.errors import Snooze
from jobq.jobs import job_state
from jobq.queue import Job, JobContext, Registry, enqueue, enqueue_many
from jobq.testing import (
    MAX_LISTED,
    NotDrained,
    advance,
    assert_enqueued,
    assert_not_enqueued,
    drain,
    enqueued,
)
from tests.api.helpers import create_reminder, create_user
from tests.queue.helpers import counts
from tests.toolkit.receiver import WebhookReceiver

T0 = datetime(2030, 6, 1, 12, 0, tzinfo=UTC)

Ran = list[tuple[str, int, datetime]]
"""What the handlers ran: (job type, its `n`, `jobq.clock.now()` when it ran)."""


class Args(BaseModel):
    n: int = 0


class FailedOnPurpose(Exception):
    """The `failing` handler always fails."""


def recording(ran: Ran) -> Registry:
    """Handlers that append what they run to `ran`: `parent` enqueues a ripe `child` and a
    `later` in an hour; `child` is a plain def (it runs in a thread); `runaway` enqueues its
    successor; `snoozer` snoozes a second; `failing` fails (2 retries)."""
    handlers = Registry()

    @handlers.handler("parent", args=Args)
    async def parent(args: Args, job: JobContext) -> None:
        ran.append(("parent", args.n, clock.now()))
        await enqueue(Job(job_type="child", arguments={"n": args.n}))
        await enqueue(Job(job_type="later", arguments={"n": args.n}).runs_in(hours=1))

    @handlers.handler("child", args=Args)
    def child(args: Args, job: JobContext) -> None:
        assert threading.current_thread() is not threading.main_thread()
        ran.append(("child", args.n, clock.now()))

    @handlers.handler("later", args=Args)
    async def later(args: Args, job: JobContext) -> None:
        ran.append(("later", args.n, clock.now()))

    @handlers.handler("runaway", args=Args)
    async def runaway(args: Args, job: JobContext) -> None:
        ran.append(("runaway", args.n, clock.now()))
        await enqueue(Job(job_type="runaway", arguments={"n": args.n + 1}))

    @handlers.handler("snoozer", args=Args)
    async def snoozer(args: Args, job: JobContext) -> None:
        ran.append(("snoozer", args.n, clock.now()))
        raise Snooze(1)

    @handlers.handler("failing", args=Args, max_retries=2)
    async def failing(args: Args, job: JobContext) -> None:
        ran.append(("failing", args.n, clock.now()))
        raise FailedOnPurpose(f"attempt {job.attempt}")

    return handlers


# -- drain ---------------------------------------------------------------------------------


async def test_drain_runs_the_ripe_jobs_and_the_ripe_jobs_they_enqueue(
    conn: Connection, settings: Settings
) -> None:
    ran: Ran = []
    with freeze_time(T0, real_asyncio=True):
        await enqueue(Job(job_type="parent", arguments={"n": 1}))
        await enqueue(Job(job_type="parent", arguments={"n": 2}))
        await enqueue(Job(job_type="later", arguments={"n": 9}).runs_in(seconds=1))
        await enqueue(Job(job_type="child", arguments={"n": 5}, queue="elsewhere"))

        drained = await drain(handlers=recording(ran), settings=settings)

        assert drained == {"completed": 4}  # two parents, then the two children they enqueued
        assert sorted((kind, n) for kind, n, _ in ran) == [
            ("child", 1),
            ("child", 2),
            ("parent", 1),
            ("parent", 2),
        ]
        assert {at for _, _, at in ran} == {T0}
        # not ripe, or in a queue these handlers do not serve: still queued
        queued = [(j["job_type"], j["arguments"]["n"], j["ripe_at"]) for j in await enqueued()]
        assert sorted(queued) == [
            ("child", 5, T0),
            ("later", 1, T0 + timedelta(hours=1)),
            ("later", 2, T0 + timedelta(hours=1)),
            ("later", 9, T0 + timedelta(seconds=1)),
        ]
        assert await drain(handlers=recording(ran), settings=settings) == {}
    assert await counts(conn) == {"job": 4, "job_running": 0, "job_dead": 0}
    assert await conn.fetchval("SELECT count(*) FROM worker") == 0  # each drain's worker left


async def test_drain_leaves_a_retry_to_its_backoff_and_advance_runs_it_when_ripe(
    conn: Connection, settings: Settings
) -> None:
    ran: Ran = []
    handlers = recording(ran)
    with freeze_time(T0, real_asyncio=True) as frozen:
        await enqueue(Job(job_type="failing", arguments={"n": 1}), handlers=handlers)

        assert await drain(handlers=handlers, settings=settings) == {"retried": 1}
        [job] = await assert_enqueued("failing")
        assert job["attempts"] == 1
        assert job["last_error"] == "FailedOnPurpose: attempt 1"
        assert job["ripe_at"] > T0  # settings.backoff_base (1 s) less its jitter
        first_retry_at = job["ripe_at"]
        assert await drain(handlers=handlers, settings=settings) == {}  # not ripe yet

        drained = await advance(frozen, 60, handlers=handlers, settings=settings)

        assert drained == {"retried": 1, "buried": 1}
        assert clock.now() == T0 + timedelta(seconds=60)
    times = [at for _, _, at in ran]
    assert times[:2] == [T0, first_retry_at]  # each attempt at its ripe_at, not at the end
    assert T0 < times[1] < times[2] < T0 + timedelta(seconds=60)
    assert await counts(conn) == {"job": 0, "job_running": 0, "job_dead": 1}


async def test_drain_stops_a_job_that_enqueues_itself_without_end(
    conn: Connection, settings: Settings
) -> None:
    ran: Ran = []
    await enqueue(Job(job_type="runaway", arguments={"n": 1}))

    with pytest.raises(NotDrained) as raised:
        await drain(handlers=recording(ran), settings=settings, max_rounds=5)

    message = str(raised.value)
    assert "max_rounds=5" in message
    assert "enqueues itself" in message
    assert "{'completed': 6}" in message
    assert "ripe now: runaway x1" in message
    assert [n for _, n, _ in ran] == [1, 2, 3, 4, 5, 6]  # 5 rounds, and the one that said so
    await assert_enqueued("runaway", arguments={"n": 7})
    assert await counts(conn) == {"job": 1, "job_running": 0, "job_dead": 0}
    assert await conn.fetchval("SELECT count(*) FROM worker") == 0


async def test_drain_and_advance_refuse_to_run_inside_a_transaction(
    database: Database, settings: Settings
) -> None:
    async with transaction():
        with pytest.raises(RuntimeError, match="inside a transaction"):
            await drain(settings=settings)
        with freeze_time(T0, real_asyncio=True) as frozen, pytest.raises(RuntimeError):
            await advance(frozen, 1, settings=settings)


# -- advance -------------------------------------------------------------------------------


async def test_advance_runs_each_job_at_its_ripe_at_and_stops_at_the_end(
    database: Database, settings: Settings
) -> None:
    ran: Ran = []
    handlers = recording(ran)
    with freeze_time(T0, real_asyncio=True) as frozen:
        await enqueue(Job(job_type="parent", arguments={"n": 1}).runs_in(seconds=10))
        await enqueue(Job(job_type="later", arguments={"n": 2}).runs_in(seconds=30))
        await enqueue(Job(job_type="later", arguments={"n": 3}).runs_in(seconds=90))

        assert await advance(frozen, timedelta(seconds=5), handlers=handlers) == {}
        assert clock.now() == T0 + timedelta(seconds=5)
        assert ran == []

        drained = await advance(frozen, timedelta(seconds=55), handlers=handlers)

        assert drained == {"completed": 3}
        assert clock.now() == T0 + timedelta(seconds=60)
        assert ran == [
            ("parent", 1, T0 + timedelta(seconds=10)),
            ("child", 1, T0 + timedelta(seconds=10)),  # enqueued by the parent, ripe then
            ("later", 2, T0 + timedelta(seconds=30)),
        ]
        # the parent's `later` ripens an hour after it ran; n=3 at 90 s: both still queued
        [job] = await assert_enqueued("later", arguments={"n": 1})
        assert job["ripe_at"] == T0 + timedelta(seconds=10, hours=1)
        await assert_enqueued("later", arguments={"n": 3}, ripe_at=T0 + timedelta(seconds=90))

        assert await advance(frozen, 30, handlers=handlers) == {"completed": 1}  # n=3, at 90 s
        assert ran[-1] == ("later", 3, T0 + timedelta(seconds=90))


async def test_advance_stops_a_job_that_snoozes_without_end(
    database: Database, settings: Settings
) -> None:
    ran: Ran = []
    with freeze_time(T0, real_asyncio=True) as frozen:
        await enqueue(Job(job_type="snoozer"))
        with pytest.raises(NotDrained, match="max_rounds=10"):
            await advance(frozen, timedelta(hours=1), handlers=recording(ran), max_rounds=10)
    # a run each second, each clock move a round: the hour is far from reached
    assert 1 < len(ran) <= 11
    assert [at for _, _, at in ran] == [T0 + timedelta(seconds=s) for s in range(len(ran))]


async def test_advance_only_moves_the_clock_forward(database: Database, settings: Settings) -> None:
    with freeze_time(T0, real_asyncio=True) as frozen:
        with pytest.raises(ValueError, match="forward"):
            await advance(frozen, -1, settings=settings)
        assert clock.now() == T0


# -- the assertions ------------------------------------------------------------------------


async def enqueue_three() -> list[int]:
    """At T0: `child` n=1 (with a tag), `child` n=2 in 5 minutes, `other` n=1 in queue bulk."""
    return [
        (await enqueue(Job(job_type="child", arguments={"n": 1, "tag": "a"}))).id,
        (await enqueue(Job(job_type="child", arguments={"n": 2}).runs_in(minutes=5))).id,
        (await enqueue(Job(job_type="other", arguments={"n": 1}, queue="bulk"))).id,
    ]


async def test_assert_enqueued_matches_type_arguments_queue_and_ripe_at(
    database: Database,
) -> None:
    with freeze_time(T0, real_asyncio=True):
        first, second, other = await enqueue_three()

    [job] = await assert_enqueued("child", arguments={"n": 1})
    assert job["id"] == first
    assert job["arguments"] == {"n": 1, "tag": "a"}  # a subset matches
    assert job["queue"] == "default"
    assert (job["ripe_at"], job["created_at"]) == (T0, T0)
    assert job["attempts"] == 0

    assert [j["id"] for j in await assert_enqueued("child")] == [first, second]
    assert [j["id"] for j in await assert_enqueued("child", arguments={})] == [first, second]
    [job] = await assert_enqueued("child", ripe_at=T0 + timedelta(minutes=5))
    assert job["id"] == second
    [job] = await assert_enqueued("other", queue="bulk", database=database)
    assert job["id"] == other
    assert [j["id"] for j in await enqueued()] == [first, other, second]
    assert [j["id"] for j in await enqueued(arguments={"n": 1})] == [first, other]


@pytest.mark.parametrize(
    ("job_type", "filters", "looked_for"),
    [
        ("child", {"arguments": {"n": 3}}, "'child' with arguments including {'n': 3}"),
        ("child", {"arguments": {"n": "1"}}, "'child' with arguments including {'n': '1'}"),
        ("child", {"arguments": {"n": 1, "tag": "b"}}, "including {'n': 1, 'tag': 'b'}"),
        ("child", {"queue": "bulk"}, "'child' in queue 'bulk'"),
        ("child", {"ripe_at": T0 + timedelta(minutes=1)}, "'child' ripe at 2030-06-01T12:01:00Z"),
        ("greet", {}, "'greet';"),
    ],
)
async def test_assert_enqueued_fails_listing_what_is_queued(
    database: Database, job_type: str, filters: dict[str, Any], looked_for: str
) -> None:
    with freeze_time(T0, real_asyncio=True):
        first, second, other = await enqueue_three()

    with pytest.raises(AssertionError) as raised:
        await assert_enqueued(job_type, **filters)

    message = str(raised.value)
    assert message.startswith("no queued job ")
    assert looked_for in message
    assert message.endswith(
        "queued (3):\n"
        f"  #{first} child {{'n': 1, 'tag': 'a'}} queue=default ripe_at=2030-06-01T12:00:00Z"
        " attempts=0\n"
        f"  #{other} other {{'n': 1}} queue=bulk ripe_at=2030-06-01T12:00:00Z attempts=0\n"
        f"  #{second} child {{'n': 2}} queue=default ripe_at=2030-06-01T12:05:00Z attempts=0"
    )


async def test_assert_enqueued_on_an_empty_queue_says_so(database: Database) -> None:
    with pytest.raises(AssertionError, match=r"^no queued job 'greet'; the queue is empty$"):
        await assert_enqueued("greet")


async def test_assert_enqueued_lists_the_first_jobs_of_a_long_queue(database: Database) -> None:
    await enqueue_many(Job(job_type="child", arguments={"n": n}) for n in range(MAX_LISTED + 5))
    with pytest.raises(AssertionError) as raised:
        await assert_enqueued("child", arguments={"n": -1})
    lines = str(raised.value).splitlines()
    assert f"queued ({MAX_LISTED + 5}):" in lines[0]
    assert len(lines) == 1 + MAX_LISTED + 1
    assert lines[-1] == "  ... and 5 more"


async def test_assert_not_enqueued_fails_listing_the_matches(database: Database) -> None:
    with freeze_time(T0, real_asyncio=True):
        first, second, _ = await enqueue_three()

    await assert_not_enqueued("child", arguments={"n": 3})
    await assert_not_enqueued("greet")
    with pytest.raises(AssertionError) as raised:
        await assert_not_enqueued("child")
    assert str(raised.value) == (
        "expected no queued job 'child'; found (2):\n"
        f"  #{first} child {{'n': 1, 'tag': 'a'}} queue=default ripe_at=2030-06-01T12:00:00Z"
        " attempts=0\n"
        f"  #{second} child {{'n': 2}} queue=default ripe_at=2030-06-01T12:05:00Z attempts=0"
    )


async def test_the_assertions_read_through_the_transaction_in_progress(
    database: Database,
) -> None:
    class RolledBack(Exception):
        pass

    async def enqueue_look_and_roll_back() -> None:
        async with transaction():
            await enqueue(Job(job_type="child", arguments={"n": 1}))
            await assert_enqueued("child", arguments={"n": 1})  # uncommitted: seen through it
            assert await enqueued(database=database) == []  # a pooled connection: not seen
            raise RolledBack

    with pytest.raises(RolledBack):
        await enqueue_look_and_roll_back()
    await assert_not_enqueued("child")


# -- jobq's own jobs -----------------------------------------------------------------------


async def test_a_reminder_is_delivered_when_the_clock_reaches_it(
    client: Client, receiver: WebhookReceiver, settings: Settings
) -> None:
    due = T0 + timedelta(seconds=90)
    with freeze_time(T0, real_asyncio=True) as frozen:
        user = await create_user(client, webhook_url=receiver.url)
        reminder = await create_reminder(
            client, user["id"], message="Call Bob", remind_in_seconds=90
        )
        [job] = await assert_enqueued(
            "send_reminder", arguments={"reminder_id": reminder["id"]}, queue="reminders"
        )
        assert (job["id"], job["ripe_at"]) == (reminder["job_id"], due)

        async with job_state(settings) as state:
            assert await advance(frozen, 60, settings=settings, state=state) == {}
            assert receiver.requests == []
            assert await advance(frozen, 60, settings=settings, state=state) == {"completed": 1}

        assert len(receiver.requests) == 1
        await assert_not_enqueued("send_reminder")
        response = await client.get(f"/reminders/{reminder['id']}")
    sent = await response.get_json()
    assert sent["status"] == "sent"
    assert datetime.fromisoformat(sent["sent_at"]) == due  # run at its time, not at the end


# -- the README ----------------------------------------------------------------------------


def readme_example() -> str:
    """The first python block of the README's "Testing your handlers" section."""
    readme = (PROJECT_ROOT / "README.md").read_text(encoding="utf-8")
    _, found, section = readme.partition("\n### Testing your handlers\n")
    assert found, "README.md has no section 'Testing your handlers'"
    _, found, block = section.partition("\n```python\n")
    assert found, "the section has no python block"
    return block.partition("\n```\n")[0]


async def test_the_readme_example_runs_as_written(database: Database) -> None:
    code = compile(readme_example(), "README.md (Testing your handlers)", "exec", dont_inherit=True)
    namespace: dict[str, Any] = {"__name__": "readme_example"}
    exec(code, namespace)  # noqa: S102 (the README's own example, read from the repository)

    await namespace["test_greet_then_follow_up"](database)

    assert namespace["greeted"] == [7, -7]
