"""Job handlers and queues: `@handler("job_type", args=Model, queue=..., timeout=...)` on an
`async def` or a `def`, and `queue(name, max_running=..., ...)` to declare a queue's limits."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from pydantic import BaseModel

from jobq.queue.backoff import Backoff
from jobq.queue.model import DEFAULT_MAX_RETRIES, DEFAULT_UNIQUE, JobContext, Unique
from jobq.queue.recurrence import Misfire, ScheduleSpec

A = TypeVar("A", bound=BaseModel)
F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_QUEUE = "default"
QUEUE_NAME = re.compile(r"^[a-z][a-z0-9_.:-]{0,62}$")


@dataclass(frozen=True, slots=True)
class Rate:
    """At most `max_starts` claims in any `period` (a sliding window)."""

    max_starts: int
    period: timedelta

    def __post_init__(self) -> None:
        if self.max_starts <= 0:
            raise ValueError(f"a rate's max_starts must be > 0, not {self.max_starts}")
        if self.period <= timedelta(0):
            raise ValueError(f"a rate's period must be > 0, not {self.period}")


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """A queue and its limits, which hold across every worker process (None: no limit).

    `slots`: a worker's default slots for it (None: `Settings.max_concurrent_jobs`; the
    `JOBQ_QUEUES` setting overrides). `max_running`: at most that many of its jobs running at
    once anywhere; `max_running_per_key`: at most that many of one `concurrency_key`; `rate`
    and `rate_per_key`: at most so many claims per period, of the queue or of one key.
    Raises: `ValueError` for a malformed name or a limit <= 0.
    """

    name: str
    slots: int | None = None
    max_running: int | None = None
    max_running_per_key: int | None = None
    rate: Rate | None = None
    rate_per_key: Rate | None = None

    def __post_init__(self) -> None:
        if not QUEUE_NAME.match(self.name):
            raise ValueError(f"queue name {self.name!r}: lower-case letters, digits, _.:-")
        for field in ("slots", "max_running", "max_running_per_key"):
            value = getattr(self, field)
            if value is not None and value <= 0:
                raise ValueError(f"queue {self.name!r}: {field} must be > 0, not {value}")


@dataclass(frozen=True, slots=True)
class Handler:
    """A registered handler: called as `fn(args, job)` with `args` validated into `args_model`.

    An `async def` runs as a task on the event loop; a plain `def` runs in the worker's thread
    pool. `timeout` limits one attempt (None: the worker's default). `max_retries`: its jobs'
    retries unless an enqueue says otherwise; `backoff`: its retry delays (None: the
    settings')."""

    job_type: str
    fn: Callable[[Any, JobContext], Any]
    args_model: type[BaseModel]
    timeout: timedelta | None
    is_async: bool
    queue: str
    max_retries: int = DEFAULT_MAX_RETRIES
    backoff: Backoff | None = None
    unique: Unique = DEFAULT_UNIQUE


class Registry:
    """Handlers by job type, and the queues they run on."""

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}
        self._schedules: dict[str, ScheduleSpec] = {}
        self._queues: dict[str, QueueSpec] = {DEFAULT_QUEUE: QueueSpec(DEFAULT_QUEUE)}

    def handler(
        self,
        job_type: str,
        *,
        args: type[A],
        queue: str = DEFAULT_QUEUE,
        timeout: timedelta | float | None = None,
        max_retries: int = DEFAULT_MAX_RETRIES,
        backoff: Backoff | None = None,
        unique: Unique = DEFAULT_UNIQUE,
    ) -> Callable[[F], F]:
        """Register the decorated function as the handler of `job_type`, whose jobs go to
        `queue` unless an enqueue names another (an undeclared queue is declared, no limits).

        `args` is the pydantic model the job's arguments are validated into before the call
        (invalid arguments send the job to the dead letter, not into retries). `timeout` is a
        `timedelta` or seconds. `max_retries` (0-100) is its jobs' retries unless an enqueue
        names its own; `backoff` its retry delays (None: `Settings.backoff_*`); `unique`
        which of its enqueues are one job unless an enqueue says otherwise (`Unique`).
        Raises: `ValueError` when `job_type` has a handler already, for a malformed queue name,
        or `max_retries` outside 0-100.
        """
        if not 0 <= max_retries <= 100:
            raise ValueError(f"max_retries must be within 0-100, not {max_retries}")
        limit = timedelta(seconds=timeout) if isinstance(timeout, int | float) else timeout
        if queue not in self._queues:
            self.queue(queue)

        def register(fn: F) -> F:
            if job_type in self._handlers:
                raise ValueError(f"job type {job_type!r} has a handler already")
            self._handlers[job_type] = Handler(
                job_type=job_type,
                fn=fn,
                args_model=args,
                timeout=limit,
                is_async=inspect.iscoroutinefunction(fn),
                queue=queue,
                max_retries=max_retries,
                backoff=backoff,
                unique=unique,
            )
            return fn

        return register

    def queue(
        self,
        name: str,
        *,
        slots: int | None = None,
        max_running: int | None = None,
        max_running_per_key: int | None = None,
        rate: Rate | None = None,
        rate_per_key: Rate | None = None,
    ) -> QueueSpec:
        """Declare queue `name` and its limits (see `QueueSpec`), replacing an earlier
        declaration; workers write the limits to the database when they start. Return it.
        Raises: `ValueError` for a malformed name or a limit <= 0."""
        spec = QueueSpec(name, slots, max_running, max_running_per_key, rate, rate_per_key)
        self._queues[name] = spec
        return spec

    def periodic(
        self,
        cron: str | None = None,
        *,
        every: timedelta | float | None = None,
        tz: str = "UTC",
        arguments: dict[str, Any] | None = None,
        misfire: Misfire = "one",
        backfill: int | None = None,
        name: str | None = None,
        queue: str | None = None,
    ) -> Callable[[F], F]:
        """Declare the decorated handler (registered with `@handler`, below this decorator)
        periodic: its job is enqueued with `arguments` at each occurrence of `cron` (5 fields,
        or 6 with seconds first; wall-clock time in IANA zone `tz`) or of `every` (a
        `timedelta` or seconds, at least 1 s, on multiples of it since the Unix epoch).
        `misfire` says what becomes of occurrences missed while no worker ran: `skip`, `one`
        (the latest, once) or `backfill` (the `backfill` latest). `name` (default: the job
        type) identifies the schedule; workers write it to `job_schedule` when they start
        (`jobq.queue.schedule`). Raises: `ValueError` for an invalid expression or zone, an
        interval under 1 s, or a function with no handler yet."""
        every_s = every.total_seconds() if isinstance(every, timedelta) else every

        def declare(fn: F) -> F:
            job_type = next((h.job_type for h in self._handlers.values() if h.fn is fn), None)
            if job_type is None:
                raise ValueError("@periodic goes above @handler (the handler first)")
            spec = ScheduleSpec(
                name=name or job_type,
                job_type=job_type,
                cron=cron,
                every_s=every_s,
                tz=tz,
                arguments=tuple(sorted((arguments or {}).items())),
                misfire=misfire,
                backfill=backfill,
                queue=queue,
            )
            self._schedules[spec.name] = spec
            return fn

        return declare

    def schedules(self) -> list[ScheduleSpec]:
        """Return the schedules declared in code."""
        return list(self._schedules.values())

    def queues(self) -> dict[str, QueueSpec]:
        """Return the declared queues by name (`default` always among them)."""
        return dict(self._queues)

    def queue_of(self, job_type: str) -> str:
        """Return the queue of `job_type`'s handler, or `default` without one."""
        spec = self._handlers.get(job_type)
        return spec.queue if spec is not None else DEFAULT_QUEUE

    def max_retries_of(self, job_type: str) -> int:
        """Return the `max_retries` of `job_type`'s handler, or `DEFAULT_MAX_RETRIES`."""
        spec = self._handlers.get(job_type)
        return spec.max_retries if spec is not None else DEFAULT_MAX_RETRIES

    def unique_of(self, job_type: str) -> Unique:
        """Return the `Unique` of `job_type`'s handler, or `DEFAULT_UNIQUE`."""
        spec = self._handlers.get(job_type)
        return spec.unique if spec is not None else DEFAULT_UNIQUE

    def get(self, job_type: str) -> Handler | None:
        """Return the handler of `job_type`, or None."""
        return self._handlers.get(job_type)


registry = Registry()
"""The process's default registry; `jobq.jobs` registers the application's handlers here."""

handler = registry.handler

periodic = registry.periodic
"""Declare a handler periodic on the default registry (see `Registry.periodic`)."""

declare_queue = registry.queue
"""Declare a queue and its limits on the default registry (see `Registry.queue`)."""
