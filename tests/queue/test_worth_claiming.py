"""Which queues a round claims (`Wakeups.worth_claiming`): every queue after news, only the
queues where work may be after its own jobs ended; the timer keeps the others' next ripe time.
No database."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from freezegun import freeze_time

from jobq.config import Settings
from jobq.queue.slots import Slots
from jobq.queue.wakeup import Wakeups

T0 = datetime(2030, 1, 1, tzinfo=UTC)
FREE = {"a": 4, "b": 4, "c": 4}


async def _never(_now: datetime, _queues: list[str]) -> datetime | None:
    return None


def wakeups() -> Wakeups:
    return Wakeups(
        Settings(database_url="postgresql://unused/db"),
        Slots(dict(FREE)),
        lock=asyncio.Lock(),
        stopping=asyncio.Event(),
        cancel=lambda _job_id: None,
        next_ripe_at=_never,
    )


def claimed_once(w: Wakeups, next_ripe_at: datetime | None, filled: list[str]) -> None:
    """A first round: all queues, then what its claim found."""
    assert w.worth_claiming(dict(FREE), set()) == FREE
    w.claiming()
    w.claimed(next_ripe_at, {name: ["t"] for name in filled})


def test_after_its_own_jobs_end_a_round_claims_the_filled_queues_and_those_they_ended_in() -> None:
    w = wakeups()
    claimed_once(w, T0, filled=["a"])
    w.job_ended()
    assert w.worth_claiming(dict(FREE), {"b"}) == {"a": 4, "b": 4}


def test_news_makes_every_queue_worth_claiming() -> None:
    w = wakeups()
    claimed_once(w, T0, filled=["a"])
    w.job_ended()
    w.event.set()  # an enqueue here, a notification, the hub, a stop
    assert w.worth_claiming(dict(FREE), set()) == FREE


def test_a_round_with_no_wake_up_claims_every_queue() -> None:
    """A round run by hand (as the tests do) or after a nap that nothing ended."""
    w = wakeups()
    claimed_once(w, T0, filled=["a"])
    assert w.worth_claiming(dict(FREE), set()) == FREE


async def test_a_partial_round_keeps_the_earlier_next_ripe_time_of_the_queues_it_left_out() -> None:
    w = wakeups()
    soon, later = T0 + timedelta(seconds=1), T0 + timedelta(seconds=3)
    with freeze_time(T0, real_asyncio=True):
        claimed_once(w, soon, filled=["a"])  # `b` or `c` holds a job due at `soon`
        w.job_ended()
        assert w.worth_claiming(dict(FREE), set()) == {"a": 4}
        w.claiming()
        w.claimed(later, {})  # a claim of `a` alone knows only of `later`
        assert await w.idle_timeout() == 1.0  # the timer still rings at `soon`
        # a full round tells the whole truth again
        w.event.set()
        assert w.worth_claiming(dict(FREE), set()) == FREE
        w.claiming()
        w.claimed(later, {})
        assert await w.idle_timeout() == 3.0
