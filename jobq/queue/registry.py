"""Job handlers: `@handler("job_type", args=Model, timeout=...)` on an `async def` or a `def`."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from pydantic import BaseModel

from jobq.queue.model import JobContext

A = TypeVar("A", bound=BaseModel)
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class Handler:
    """A registered handler: called as `fn(args, job)` with `args` validated into `args_model`.

    An `async def` runs as a task on the event loop; a plain `def` runs in the worker's thread
    pool. `timeout` limits one attempt (None: the worker's default)."""

    job_type: str
    fn: Callable[[Any, JobContext], Any]
    args_model: type[BaseModel]
    timeout: timedelta | None
    is_async: bool


class Registry:
    """Handlers by job type."""

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}

    def handler(
        self, job_type: str, *, args: type[A], timeout: timedelta | float | None = None
    ) -> Callable[[F], F]:
        """Register the decorated function as the handler of `job_type`.

        `args` is the pydantic model the job's arguments are validated into before the call
        (invalid arguments send the job to the dead letter, not into retries). `timeout` is a
        `timedelta` or seconds. Raises: `ValueError` when `job_type` has a handler already.
        """
        limit = timedelta(seconds=timeout) if isinstance(timeout, int | float) else timeout

        def register(fn: F) -> F:
            if job_type in self._handlers:
                raise ValueError(f"job type {job_type!r} has a handler already")
            self._handlers[job_type] = Handler(
                job_type=job_type,
                fn=fn,
                args_model=args,
                timeout=limit,
                is_async=inspect.iscoroutinefunction(fn),
            )
            return fn

        return register

    def get(self, job_type: str) -> Handler | None:
        """Return the handler of `job_type`, or None."""
        return self._handlers.get(job_type)

    def job_types(self) -> list[str]:
        """Return the registered job types, sorted."""
        return sorted(self._handlers)


registry = Registry()
"""The process's default registry; `jobq.jobs` registers the application's handlers here."""

handler = registry.handler
