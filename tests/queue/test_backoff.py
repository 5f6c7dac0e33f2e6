"""The retry policy as a pure function: no database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from jobq.queue.backoff import backoff_delay, next_ripe_at

BASE = timedelta(seconds=2)
CAP = timedelta(hours=1)


@pytest.mark.parametrize(
    ("attempts", "seconds"), [(1, 2), (2, 4), (3, 8), (4, 16), (10, 1024), (11, 2048)]
)
def test_delay_doubles_from_base_without_jitter(attempts: int, seconds: float) -> None:
    delay = backoff_delay(attempts, base=BASE, cap=CAP, jitter=0)
    assert delay == timedelta(seconds=seconds)


@pytest.mark.parametrize("attempts", [12, 13, 50, 62, 63, 64, 1000, 10**9])
def test_delay_is_capped(attempts: int) -> None:
    assert backoff_delay(attempts, base=BASE, cap=CAP, jitter=0) == CAP
    assert backoff_delay(attempts, base=BASE, cap=CAP, jitter=0.5, rand=0) == CAP
    assert backoff_delay(attempts, base=BASE, cap=CAP, jitter=0.5, rand=0.5) == CAP * 0.75


def test_cap_below_base_wins() -> None:
    delay = backoff_delay(1, base=timedelta(seconds=10), cap=timedelta(seconds=3), jitter=0)
    assert delay == timedelta(seconds=3)


@pytest.mark.parametrize(
    ("jitter", "rand", "seconds"),
    [
        (0.25, 0.0, 8.0),  # u = 0: the full delay
        (0.25, 0.5, 7.0),
        (0.5, 0.5, 6.0),  # equal jitter
        (1.0, 0.5, 4.0),  # full jitter
        (1.0, 0.0, 8.0),
        (0.0, 0.9, 8.0),  # no jitter: rand is irrelevant
    ],
)
def test_jitter_formula(jitter: float, rand: float, seconds: float) -> None:
    assert backoff_delay(3, base=BASE, cap=CAP, jitter=jitter, rand=rand) == timedelta(
        seconds=seconds
    )


@pytest.mark.parametrize("jitter", [0.1, 0.25, 0.5, 1.0])
@pytest.mark.parametrize("attempts", [1, 4, 30])
def test_random_jitter_stays_within_bounds_and_spreads(jitter: float, attempts: int) -> None:
    ceiling = min(CAP, BASE * 2 ** (attempts - 1))
    delays = [backoff_delay(attempts, base=BASE, cap=CAP, jitter=jitter) for _ in range(500)]
    assert all(ceiling * (1 - jitter) < d <= ceiling for d in delays)
    # jobs that failed together do not come back together
    assert len(set(delays)) > 400
    assert max(delays) - min(delays) > ceiling * jitter * 0.5


def test_almost_one_rand_is_the_lower_bound() -> None:
    delay = backoff_delay(2, base=BASE, cap=CAP, jitter=0.25, rand=0.999999)
    assert timedelta(seconds=3) < delay < timedelta(seconds=3.0001)


@pytest.mark.parametrize("attempts", [0, -1, -100])
def test_attempts_below_one_is_an_error(attempts: int) -> None:
    with pytest.raises(ValueError, match="attempts"):
        backoff_delay(attempts, base=BASE, cap=CAP, jitter=0)
    with pytest.raises(ValueError, match="attempts"):
        next_ripe_at(attempts, datetime.now(UTC), base=BASE, cap=CAP, jitter=0)


@pytest.mark.parametrize("jitter", [-0.01, 1.01, 2.0, float("nan")])
def test_jitter_outside_zero_one_is_an_error(jitter: float) -> None:
    with pytest.raises(ValueError, match="jitter"):
        backoff_delay(1, base=BASE, cap=CAP, jitter=jitter)


def test_next_ripe_at_adds_the_delay_to_now() -> None:
    now = datetime(2030, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    ripe_at = next_ripe_at(3, now, base=BASE, cap=CAP, jitter=0.5, rand=0.5)
    assert ripe_at == now + timedelta(seconds=6)
    assert ripe_at.tzinfo is not None
    assert next_ripe_at(100, now, base=BASE, cap=CAP, jitter=0) == now + CAP


def test_next_ripe_at_is_later_for_later_attempts() -> None:
    now = datetime(2030, 1, 1, tzinfo=UTC)
    ripe = [next_ripe_at(a, now, base=BASE, cap=CAP, jitter=0, rand=0) for a in range(1, 15)]
    assert ripe == sorted(ripe)
    assert ripe[0] > now
