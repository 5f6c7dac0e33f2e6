"""The cap on a user's unsent reminders holds exactly under concurrent creations, each on real
connections of its own, and no creation waits for another's commit (`jobq.domain.creation`,
`sql/functions/reminder_hold_take.sql`)."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine
from datetime import timedelta
from typing import Any, TypeVar

import asyncpg
import pytest

from jobq import clock, db, statements
from jobq.db import Connection, Database
from jobq.domain.creation import HOLD_GRACE, schedule_reminder
from jobq.domain.reminders import SEND_REMINDER, NewReminder, Reminder
from jobq.errors import LimitReached
from jobq.queue import Job, enqueue_columns

T = TypeVar("T")

CAP = 5
WAIT_S = 30.0
"""Generous: a creation that waits for another's commit would wait until the test ends."""


def new(message: str) -> NewReminder:
    return NewReminder(message=message, remind_in_seconds=3600)


async def make_user(conn: Connection, email: str = "ann@example.com") -> int:
    user_id: int = await conn.fetchval(
        "INSERT INTO users (name, email, created_at) VALUES ('Ann', $1, now()) RETURNING id", email
    )
    return user_id


def apart(database: Database, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """Run `coro` as another request would: a task with a context of its own (no transaction
    inherited), on its own pooled connections."""

    async def run() -> T:
        db.bind(database)
        return await coro

    return asyncio.create_task(run(), context=contextvars.Context())


async def unsent(conn: Connection, user_id: int) -> int:
    count: int = await conn.fetchval(
        "SELECT count(*) FROM reminders WHERE user_id = $1 AND sent_at IS NULL", user_id
    )
    return count


async def test_n_plus_k_concurrent_creations_against_a_cap_of_n(
    database: Database, conn: Connection
) -> None:
    user_id = await make_user(conn)
    creations = [
        apart(database, schedule_reminder(user_id, new(f"r{i}"), max_unsent=CAP))
        for i in range(CAP + 4)
    ]
    outcomes = await asyncio.gather(*creations, return_exceptions=True)
    made = [o for o in outcomes if isinstance(o, Reminder)]
    refused = [o for o in outcomes if isinstance(o, LimitReached)]
    assert (len(made), len(refused)) == (CAP, 4), outcomes
    assert await unsent(conn, user_id) == CAP
    assert sorted(r.id for r in made) == sorted(
        await conn.fetchval("SELECT array_agg(id) FROM reminders WHERE user_id = $1", user_id)
    )
    assert await conn.fetchval("SELECT count(*) FROM reminder_holds") == 0
    assert await conn.fetchval("SELECT count(*) FROM job") == CAP


async def test_an_open_creation_blocks_no_other_and_counts_against_the_cap(
    database: Database, conn: Connection
) -> None:
    user_id = await make_user(conn)
    async with db.transaction():  # a request whose commit has not come yet
        first = await schedule_reminder(user_id, new("first"), max_unsent=2)
        # other requests of the same user go on meanwhile, to their commit
        second = await asyncio.wait_for(
            apart(database, schedule_reminder(user_id, new("second"), max_unsent=2)), WAIT_S
        )
        assert await unsent(conn, user_id) == 1  # the second, committed; the first is not yet
        with pytest.raises(LimitReached):  # the first, uncommitted, holds its place
            await asyncio.wait_for(
                apart(database, schedule_reminder(user_id, new("third"), max_unsent=2)), WAIT_S
            )
    assert await unsent(conn, user_id) == 2
    assert {first.id, second.id} == set(
        await conn.fetchval("SELECT array_agg(id) FROM reminders WHERE user_id = $1", user_id)
    )


async def test_a_creation_rolled_back_gives_its_place_back(
    database: Database, conn: Connection
) -> None:
    user_id = await make_user(conn)

    class Abandoned(Exception):
        pass

    async def abandoned() -> None:
        async with db.transaction():
            await schedule_reminder(user_id, new("first"), max_unsent=1)
            raise Abandoned

    with pytest.raises(Abandoned):
        await abandoned()
    assert await unsent(conn, user_id) == 0
    assert await conn.fetchval("SELECT count(*) FROM reminder_holds") == 1  # the outer's
    # the hold of a transaction that failed outside the creation is its dead request's: a take
    # at the cap drops it once HOLD_GRACE has passed
    await conn.execute("UPDATE reminder_holds SET taken_at = taken_at - $1::interval", HOLD_GRACE)
    await apart(database, schedule_reminder(user_id, new("again"), max_unsent=1))
    assert await unsent(conn, user_id) == 1
    assert await conn.fetchval("SELECT count(*) FROM reminder_holds") == 0


async def test_a_failed_creation_releases_its_hold(database: Database, conn: Connection) -> None:
    user_id = await make_user(conn)
    # a message the database refuses (validation would have): the creation fails after its take
    refused = NewReminder.model_construct(message="a\x00b", remind_in_seconds=3600.0)
    with pytest.raises(asyncpg.PostgresError):
        await schedule_reminder(user_id, refused, max_unsent=1)
    assert await conn.fetchval("SELECT count(*) FROM reminder_holds") == 0
    assert await conn.fetchval("SELECT count(*) FROM job") == 0
    await schedule_reminder(user_id, new("fits"), max_unsent=1)


async def test_a_dead_requests_hold_is_dropped_after_the_grace_unless_held(
    database: Database, conn: Connection
) -> None:
    user_id = await make_user(conn)
    old = clock.now() - 2 * HOLD_GRACE

    async def take(now: Any) -> int:
        async with database.pool.acquire() as pooled:
            row = await statements.reminder_hold_take.fetchrow(
                pooled, user_id=user_id, max_unsent=2, now=now, grace=HOLD_GRACE
            )
        hold_id: int = row["hold_id"]
        return hold_id

    dead = await take(old)  # a request killed after its take
    live = await take(old)  # a slow request, whose transaction has its hold
    async with db.transaction() as tx:
        due = clock.now() + timedelta(hours=1)
        made = await statements.reminder_create_one_off.fetchrow(
            tx,
            id=live,
            user_id=user_id,
            message="slow",
            remind_at=due,
            now=clock.now(),
            **enqueue_columns(Job(job_type=SEND_REMINDER, arguments={"id": live}, ripe_at=due)),
        )
        assert made["id"] == live
        # at the cap: the dead hold is dropped, the held one stays counted
        other = await apart(database, schedule_reminder(user_id, new("next"), max_unsent=2))
        with pytest.raises(LimitReached):
            await apart(database, schedule_reminder(user_id, new("over"), max_unsent=2))
    assert await conn.fetchval("SELECT count(*) FROM reminder_holds WHERE id = $1", dead) == 0
    assert {live, other.id} == set(
        await conn.fetchval("SELECT array_agg(id) FROM reminders WHERE user_id = $1", user_id)
    )


async def test_the_take_refuses_to_run_inside_a_transaction(
    database: Database, conn: Connection
) -> None:
    user_id = await make_user(conn)
    async with db.transaction() as tx:
        await tx.execute("INSERT INTO users (name, email, created_at) VALUES ('B', 'b@x', now())")
        with pytest.raises(Exception, match="autocommit"):
            await statements.reminder_hold_take.fetchrow(
                tx, user_id=user_id, max_unsent=2, now=clock.now(), grace=HOLD_GRACE
            )
