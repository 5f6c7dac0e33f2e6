"""Recurring schedules: occurrences across the 2026 DST changes of Europe/Paris and
America/New_York, misfire policies across an outage, declarations synchronised at worker start,
and exactly one job per occurrence with several schedulers at once (real connections)."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from freezegun import freeze_time
from pydantic import BaseModel

from jobq.db import Connection, Database
from jobq.queue import JobContext, Registry, schedule
from jobq.queue.leader.schedules import enqueue_due
from jobq.queue.recurrence import Cron, Interval, Rule, ScheduleSpec, due, wall_time, zone
from tests.queue.helpers import MakeWorker

PARIS = zone("Europe/Paris")
NEW_YORK = zone("America/New_York")


class Args(BaseModel):
    n: int = 0


def walk(recurrence: Cron | Rule, start: datetime, count: int) -> list[datetime]:
    found, t = [], start
    for _ in range(count):
        nxt = recurrence.after(t)
        assert nxt is not None
        found.append(nxt)
        t = nxt
    return found


# -- when: time zones and DST (no database) -------------------------------------------------------


@pytest.mark.parametrize(
    ("tz", "before_utc", "after_utc", "start"),
    [
        # Paris: CET (+1) until 2026-03-29, CEST (+2) until 2026-10-25
        (PARIS, 8, 7, datetime(2026, 3, 26, tzinfo=UTC)),
        (PARIS, 7, 8, datetime(2026, 10, 22, tzinfo=UTC)),
        # New York: EST (-5) until 2026-03-08, EDT (-4) until 2026-11-01
        (NEW_YORK, 14, 13, datetime(2026, 3, 5, tzinfo=UTC)),
        (NEW_YORK, 13, 14, datetime(2026, 10, 29, tzinfo=UTC)),
    ],
    ids=["paris-spring", "paris-fall", "new-york-spring", "new-york-fall"],
)
def test_nine_o_clock_local_is_nine_o_clock_on_both_sides_of_a_dst_change(
    tz: ZoneInfo, before_utc: int, after_utc: int, start: datetime
) -> None:
    cron = Cron("0 9 * * *", tz)
    days = walk(cron, start, 6)
    assert [d.astimezone(tz).hour for d in days] == [9] * 6
    assert [d.hour for d in days[:2]] == [before_utc] * 2
    assert [d.hour for d in days[-2:]] == [after_utc] * 2


def test_a_skipped_local_time_moves_forward_by_the_gap_and_a_repeated_one_fires_once() -> None:
    # 2026-03-29 02:30 does not exist in Paris: it fires at 03:30 CEST (01:30 UTC)
    spring = Cron("30 2 * * *", PARIS).after(datetime(2026, 3, 28, 12, tzinfo=UTC))
    assert spring == datetime(2026, 3, 29, 1, 30, tzinfo=UTC)
    assert spring.astimezone(PARIS).strftime("%H:%M %Z") == "03:30 CEST"
    # 2026-10-25 02:30 happens twice in Paris: once, at the first (CEST, 00:30 UTC)
    fall = walk(Cron("30 2 * * *", PARIS), datetime(2026, 10, 24, 12, tzinfo=UTC), 2)
    assert fall == [
        datetime(2026, 10, 25, 0, 30, tzinfo=UTC),
        datetime(2026, 10, 26, 1, 30, tzinfo=UTC),
    ]
    assert wall_time(datetime(2026, 10, 25, 2, 30), PARIS) == fall[0]
    # every 15 minutes through the repeated hour: that local hour's four occurrences once each
    quarter = walk(Cron("*/15 * * * *", PARIS), datetime(2026, 10, 24, 23, 50, tzinfo=UTC), 12)
    local = [q.astimezone(PARIS).strftime("%H:%M") for q in quarter]
    assert local == [f"{h:02}:{m:02}" for h in (2, 3, 4) for m in (0, 15, 30, 45)]
    assert quarter == sorted(set(quarter))


def test_seconds_intervals_and_rrules() -> None:
    every5 = walk(Cron("*/5 * * * * *", PARIS), datetime(2026, 1, 1, 0, 0, 1, tzinfo=UTC), 3)
    assert [t.second for t in every5] == [5, 10, 15]
    minute = Interval(timedelta(seconds=60))
    assert minute.after(datetime(2026, 1, 1, 0, 0, 30, tzinfo=UTC)) == datetime(
        2026, 1, 1, 0, 1, tzinfo=UTC
    )
    assert minute.before(datetime(2026, 1, 1, 0, 1, tzinfo=UTC)) == datetime(
        2026, 1, 1, 0, 0, tzinfo=UTC
    )
    mondays = Rule("FREQ=WEEKLY;BYDAY=MO;COUNT=3", PARIS, datetime(2026, 3, 23, 8, tzinfo=UTC))
    found = walk(mondays, datetime(2026, 3, 20, tzinfo=UTC), 2)
    assert [f.astimezone(PARIS).strftime("%m-%d %H:%M") for f in found] == [
        "03-23 09:00",
        "03-30 09:00",  # after the change: still 09:00 local
    ]
    assert mondays.after(datetime(2026, 4, 6, 7, tzinfo=UTC)) is None  # COUNT=3 reached
    for bad in (
        lambda: Cron("61 * * * *", PARIS),
        lambda: Interval(timedelta(seconds=0.5)),
        lambda: Rule("FREQ=SOMETIMES", PARIS, datetime(2026, 1, 1, tzinfo=UTC)),
        lambda: zone("Mars/Olympus_Mons"),
    ):
        with pytest.raises(ValueError):  # noqa: PT011 - each names its own reason
            bad()


# -- misfires ------------------------------------------------------------------------------------

T0 = datetime(2030, 6, 3, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("misfire", "backfill", "caught_up"),
    [("skip", None, 0), ("one", None, 1), ("backfill", 5, 5)],
)
def test_after_an_outage_the_misfire_policy_decides(
    misfire: str, backfill: int | None, caught_up: int
) -> None:
    minute = Cron("* * * * *", zone("UTC"))
    # the last occurrence enqueued was 12:00; the workers come back at 13:00:30
    now = T0 + timedelta(hours=1, seconds=30)
    ats, next_at = due(
        minute,
        T0 + timedelta(minutes=1),
        now=now,
        horizon=now + timedelta(seconds=10),
        misfire=misfire,  # type: ignore[arg-type]
        backfill=backfill,
    )
    missed = [a for a in ats if a < now - timedelta(seconds=30)]
    assert len(missed) == caught_up
    # the caught-up ones are the latest missed, in order
    assert missed == [T0 + timedelta(minutes=60 - caught_up + i) for i in range(caught_up)]
    assert [a for a in ats if a not in missed] == [T0 + timedelta(hours=1)]  # within the grace
    assert next_at == T0 + timedelta(hours=1, minutes=1)


# -- with the database --------------------------------------------------------------------------


def periodic_registry(**periodic: object) -> tuple[Registry, list[int]]:
    handlers = Registry()
    ran: list[int] = []

    @handlers.periodic(**periodic)  # type: ignore[arg-type]
    @handlers.handler("tick", args=Args)
    async def tick(args: Args, job: JobContext) -> None:
        ran.append(job.id)

    return handlers, ran


async def test_each_occurrence_runs_at_its_time_on_a_frozen_clock(
    conn: Connection, make_worker: MakeWorker
) -> None:
    handlers, ran = periodic_registry(every=timedelta(seconds=5), arguments={"n": 7})
    with freeze_time(T0, real_asyncio=True) as frozen:
        worker = await make_worker(handlers)
        assert await conn.fetchval("SELECT next_at FROM job_schedule") == T0 + timedelta(seconds=5)
        assert await worker.enqueue_scheduled() == 2  # 12:00:05 and :10, within 10 s
        assert await worker.enqueue_scheduled() == 0  # already enqueued
        for step in (5, 10, 15):
            frozen.move_to(T0 + timedelta(seconds=step))
            await worker.enqueue_scheduled()
            assert await worker.run_once() == 1
            await worker.wait_idle()
        rows = await conn.fetch("SELECT at, job_id FROM job_occurrence ORDER BY at")
        assert [r["at"] for r in rows] == [T0 + timedelta(seconds=s) for s in (5, 10, 15, 20, 25)]
        assert ran == [r["job_id"] for r in rows[:3]]
        args = await conn.fetchval("SELECT arguments FROM job_done WHERE id = $1", ran[0])
        assert args == {"n": 7}


async def test_declarations_are_synchronised_at_worker_start(
    conn: Connection, make_worker: MakeWorker
) -> None:
    with freeze_time(T0, real_asyncio=True) as frozen:
        first, _ = periodic_registry(cron="0 9 * * *", tz="Europe/Paris")
        await make_worker(first)
        row = await conn.fetchrow("SELECT cron, tz, next_at FROM job_schedule WHERE name = 'tick'")
        assert row is not None
        assert (row["cron"], row["next_at"]) == ("0 9 * * *", datetime(2030, 6, 4, 7, tzinfo=UTC))
        # the same declaration later: unchanged, its next occurrence too
        frozen.move_to(T0 + timedelta(days=3))
        await make_worker(first)
        assert await conn.fetchval("SELECT next_at FROM job_schedule") == row["next_at"]
        # changed: starts again from now
        changed, _ = periodic_registry(cron="0 10 * * *", tz="Europe/Paris")
        await make_worker(changed)
        assert await conn.fetchval("SELECT next_at FROM job_schedule") == datetime(
            2030, 6, 7, 8, tzinfo=UTC
        )
        # removed
        await make_worker(Registry())
        assert await conn.fetchval("SELECT count(*) FROM job_schedule") == 0


@pytest.mark.parametrize(("misfire", "jobs"), [("skip", 0), ("one", 1), ("backfill", 3)])
async def test_an_outage_follows_the_misfire_policy_in_the_queue(
    conn: Connection, make_worker: MakeWorker, misfire: str, jobs: int
) -> None:
    handlers, _ = periodic_registry(
        cron="* * * * *", misfire=misfire, backfill=3 if misfire == "backfill" else None
    )
    with freeze_time(T0, real_asyncio=True) as frozen:
        worker = await make_worker(handlers)
        assert await worker.enqueue_scheduled() == 0  # 12:01 is more than 10 s away
        frozen.move_to(T0 + timedelta(hours=2, seconds=55))  # two hours down
        await worker.enqueue_scheduled()
        back = T0 + timedelta(hours=2, seconds=55)
        count = "SELECT count(*) FROM job WHERE ripe_at < $1"
        # missed: before 14:00:25 (30 s of grace); 14:01 is within the 10 s ahead
        assert await conn.fetchval(count, back - timedelta(seconds=30)) == jobs
        assert await conn.fetchval(count, back + timedelta(seconds=10)) == jobs + 1


async def test_many_schedulers_at_once_make_one_job_per_occurrence(
    conn: Connection, database: Database, open_database: object, make_worker: MakeWorker
) -> None:
    """Four schedulers on pools of their own run rounds at the same moments: every occurrence
    is one job."""
    handlers, _ = periodic_registry(every=timedelta(seconds=1))
    await make_worker(handlers)
    pools = [await open_database() for _ in range(4)]  # type: ignore[operator]
    with freeze_time(T0, real_asyncio=True) as frozen:
        await conn.execute("UPDATE job_schedule SET next_at = $1", T0)
        for step in range(20):
            frozen.move_to(T0 + timedelta(seconds=step * 3))
            now = T0 + timedelta(seconds=step * 3)
            counts = await asyncio.gather(*(enqueue_due(p, handlers, now=now) for p in pools))
            assert sum(counts) == (11 if step == 0 else 3)
    jobs = await conn.fetchval("SELECT count(*) FROM job")
    occurrences = await conn.fetchval("SELECT count(DISTINCT at) FROM job_occurrence")
    assert jobs == occurrences == 11 + 19 * 3
    distinct = await conn.fetchval("SELECT count(DISTINCT ripe_at) FROM job")
    assert distinct == jobs


def test_a_bad_declaration_is_refused_at_once() -> None:
    with pytest.raises(ValueError, match="cron"):
        ScheduleSpec(name="x", job_type="x", cron="every day")
    with pytest.raises(ValueError, match="at least 1 s"):
        ScheduleSpec(name="x", job_type="x", every_s=0.2)
    with pytest.raises(ValueError, match="time zone"):
        ScheduleSpec(name="x", job_type="x", cron="* * * * *", tz="Nowhere/Else")
    with pytest.raises(ValueError, match="above @handler"):
        Registry().periodic(every=5)(lambda args, job: None)


async def test_a_schedule_whose_next_occurrence_is_over_budget_ends_after_the_one_due(
    conn: Connection, database: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """Each occurrence eleven years after the last: the one due is enqueued, then the
    schedule ends (its next is past the rules' ten-year horizon), saying so; no round blocks."""
    handlers = Registry()
    rule = "FREQ=YEARLY;INTERVAL=11"
    async with conn.transaction():
        await schedule.save(
            conn,
            name="reminder:1",
            job_type="every.eleven.years",
            arguments={},
            rrule=Rule(rule, zone("UTC"), T0).definite_text,
            tz="UTC",
            starts_at=T0,
            queue="default",
            concurrency_key=None,
            occurrence_arg="occurrence_at",
            first=T0,
        )
    with caplog.at_level(logging.WARNING):
        assert await enqueue_due(database, handlers, now=T0 - timedelta(seconds=5)) == 1
    assert await conn.fetchval("SELECT next_at FROM job_schedule") is None
    assert "over budget" in caplog.text
    assert await enqueue_due(database, handlers, now=T0 + timedelta(days=4100)) == 0
