"""The shapes of the queue: a job to enqueue, a claimed job, and what a handler is given."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Literal, NamedTuple, Self, TypeVar

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from jobq import clock

T = TypeVar("T")

DEFAULT_MAX_RETRIES = 5

_CANCELLED_LOCK = threading.Lock()
"""Makes the `JobContext.cancelled` event of an attempt exactly once."""

JobType = str
"""A job type: lower-case letters, digits and `_.:-`, starting with a letter (max 100)."""


class Unique(BaseModel):
    """Which enqueues of a job are one job, and what an enqueue that finds its twin does.

    The twin is a job of the same type with the same `key` (None: the same arguments),
    `among`: `queued` jobs (the default; free: the insert checks it), `active` ones (queued or
    running), any enqueued in the last `period` (required then, > 0), or `none` (every
    enqueue is a job). `on_conflict`: `earlier` (the default) moves a queued twin's `ripe_at`
    to this enqueue's if that is earlier, so that no job is ever postponed by a twin; `keep`
    leaves it; `raise` raises `jobq.errors.DuplicateJob`. Either way the enqueue returns the
    twin's id with `duplicate=True`.
    Raises: `ValueError` (pydantic's `ValidationError`) for `period` without `among="period"`
    or the reverse.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    among: Literal["none", "queued", "active", "period"] = "queued"
    key: str | None = Field(default=None, min_length=1, max_length=200)
    period: timedelta | None = Field(default=None, gt=timedelta(0))
    on_conflict: Literal["earlier", "keep", "raise"] = "earlier"

    @model_validator(mode="after")
    def _period(self) -> Self:
        if (self.period is not None) != (self.among == "period"):
            raise ValueError('a period goes with among="period", and only with it')
        return self


DEFAULT_UNIQUE = Unique()
"""Unique by type and arguments among queued jobs; an earlier enqueue hastens the twin."""

ALLOW_DUPLICATES = Unique(among="none")
"""Every enqueue is a job of its own."""


class Job(BaseModel):
    """A job to enqueue.

    `arguments` is a JSON object; with `job_type` it is the dedup key. `ripe_at` is an aware
    datetime (default: now, i.e. immediately). Higher `priority` runs first. After
    `max_retries` failed retries (so `max_retries + 1` attempts) the job goes to `job_dead`
    (None: its handler's `max_retries`, else `DEFAULT_MAX_RETRIES`).
    `queue` (None: its handler's queue, else `default`) decides which workers' slots run it;
    `concurrency_key` (None: none) groups the jobs that the queue's per-key limits count.
    `unique` (None: its handler's, else `DEFAULT_UNIQUE`) says which enqueues are one job.
    """

    model_config = ConfigDict(frozen=True)

    job_type: JobType = Field(pattern=r"^[a-z][a-z0-9_.:-]{0,99}$")
    arguments: dict[str, Any] = Field(default_factory=dict)
    ripe_at: AwareDatetime = Field(default_factory=clock.now)
    priority: int = Field(default=0, ge=-32768, le=32767)
    max_retries: int | None = Field(default=None, ge=0, le=100)
    queue: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9_.:-]{0,62}$")
    concurrency_key: str | None = Field(default=None, min_length=1, max_length=200)
    unique: Unique | None = None

    def runs_in(self, *, seconds: float = 0, minutes: float = 0, hours: float = 0) -> Self:
        """Return a copy that ripens that long after now (the app clock)."""
        delay = timedelta(seconds=seconds, minutes=minutes, hours=hours)
        return self.model_copy(update={"ripe_at": clock.now() + delay})

    def runs_at(self, ripe_at: datetime) -> Self:
        """Return a copy that ripens at `ripe_at` (aware). Raises `ValueError` when naive."""
        if ripe_at.tzinfo is None or ripe_at.utcoffset() is None:
            raise ValueError("ripe_at must be timezone-aware")
        return self.model_copy(update={"ripe_at": ripe_at})


@dataclass(frozen=True, slots=True)
class Enqueued:
    """The outcome of an enqueue: the job's id, and whether an identical job was queued already
    (then `id` is that job's)."""

    id: int
    duplicate: bool


class ClaimedJob(NamedTuple):
    """A row of `job_running` as the claim returned it. `attempts` counts failed attempts so
    far; `token` is the fencing token that completion, failure and release must name. (A
    NamedTuple: one is made per job claimed, and a tuple is the cheapest immutable record.)"""

    id: int
    job_type: str
    arguments: dict[str, Any]
    attempts: int
    max_retries: int
    token: int
    ripe_at: datetime
    claimed_at: datetime
    queue: str = "default"
    concurrency_key: str | None = None


class Verdict(StrEnum):
    """What becomes of a claimed job: the one vocabulary of outcomes (recorded by
    `jobq.queue.completer`, counted by `Worker.counts` under `counted`).

    `COMPLETE`: done, it leaves the queue. `RETRY`: back to `job` with one more attempt, ripe
    after its backoff. `RELEASE`: back to `job` at its place, no attempt charged (a stop).
    `SNOOZE`: back to `job`, ripe at the time the handler asked (`Snooze`), no attempt
    charged. `BURY`: to the dead letter.
    """

    COMPLETE = "complete"
    RETRY = "retry"
    RELEASE = "release"
    SNOOZE = "snooze"
    BURY = "bury"

    @property
    def counted(self) -> str:
        """The name `Worker.counts` counts it under (`completed`, `retried`, ...)."""
        return _COUNTED[self]

    @property
    def requeues(self) -> bool:
        """Whether the job goes back to `job` (any worker may then claim it)."""
        return self in (Verdict.RETRY, Verdict.RELEASE, Verdict.SNOOZE)


_COUNTED = {
    Verdict.COMPLETE: "completed",
    Verdict.RETRY: "retried",
    Verdict.RELEASE: "released",
    Verdict.SNOOZE: "snoozed",
    Verdict.BURY: "buried",
}


class Outcome(NamedTuple):
    """What to record of one attempt of a claimed job, fenced by its `token`: its `verdict`,
    for a retry or a snooze the `ripe_at` to go back at (a release keeps the job's place: its
    own `ripe_at`, or now if that is later), for a retry or burial the `error` (and the
    `traceback`, when an exception was raised), for a completion the handler's `result` as
    JSON text (None: it returned None). `cancelled`: the worker knew the job was cancelled
    while it ran (it ends `cancelled` whatever the verdict; the metrics count its cancel only).
    (A NamedTuple, as `ClaimedJob`: one is made per attempt.)"""

    token: int
    verdict: Verdict
    ripe_at: datetime | None = None
    error: str | None = None
    result: str | None = None
    traceback: str | None = None
    cancelled: bool = False


@dataclass(slots=True)
class JobContext:
    """What a handler is told about the attempt it runs.

    `attempt` is 1 for the first run; the last attempt is `max_retries + 1`. `state` holds the
    process's shared resources (settings, HTTP client), like Quart's `app.extensions`.
    `cancelled` is set when the job is cancelled while it runs (`jobq.queue.control.cancel`):
    an async handler is cancelled too (`asyncio.CancelledError`), a synchronous one cannot be
    and should check it (`is_set()`, or `wait(seconds)` instead of `time.sleep`) and return.
    """

    id: int
    job_type: str
    attempt: int
    max_retries: int
    worker_id: int
    queue: str
    state: dict[str, Any]
    loop: asyncio.AbstractEventLoop
    _cancelled: threading.Event | None = field(default=None, init=False, repr=False)

    @property
    def cancelled(self) -> threading.Event:
        """Set when the job is cancelled while it runs (see above). Made at its first use:
        most handlers never look (an event costs more to make than the rest of the context)."""
        event = self._cancelled
        if event is None:
            with _CANCELLED_LOCK:  # the loop's thread and the handler's may ask at once
                if self._cancelled is None:
                    self._cancelled = threading.Event()
                event = self._cancelled
        return event

    @property
    def is_last_attempt(self) -> bool:
        """True when a failure of this attempt sends the job to the dead letter."""
        return self.attempt > self.max_retries

    def run_coroutine(self, coro: Coroutine[Any, Any, T]) -> T:
        """From a synchronous handler's thread, run `coro` on the worker's event loop and
        return its result (or raise its exception). Raises `RuntimeError` on the loop's thread.
        """
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            coro.close()
            raise RuntimeError("run_coroutine is for synchronous handlers in the thread pool")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()
