"""Running one claimed job: validate its arguments, call its handler (on the event loop, or in
the thread pool for a plain `def`) under its timeout, and report its outcome — complete, retry
with backoff, or the dead letter — to the worker's recorder (`jobq.queue.completer`), which
records it fenced by the job's token.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import re
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

from pydantic import ValidationError
from pydantic_core import to_jsonable_python

from jobq import clock, tracing
from jobq.config import Settings
from jobq.errors import DontRetry, Snooze
from jobq.logs import bind_job
from jobq.queue import metrics
from jobq.queue.backoff import Backoff
from jobq.queue.model import ClaimedJob, JobContext, Outcome, Verdict
from jobq.queue.registry import Registry

log = logging.getLogger("jobq.worker")

Attempt = tuple[Verdict, str | None, datetime | str | None]
"""What an attempt came to (`RETRY` for any failure: `execute` buries a job out of retries),
its error, and for a `SNOOZE` when the job ripens again, for a `COMPLETE` its result (JSON),
for a failure that raised its traceback."""

MAX_ERROR_CHARS = 2000
MAX_TRACEBACK_CHARS = 8000
"""A traceback is kept up to this long (its end: the innermost frames and the error)."""

_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
"""An escaped NUL character in JSON text, which PostgreSQL's jsonb refuses."""


_NO_SPAN = contextlib.nullcontext()
"""The span of an attempt that is not traced (a nullcontext can be entered again and again)."""


class ResultError(Exception):
    """A handler's result cannot be stored: not JSON, or too large. Its job fails for good."""


def result_json(value: Any, max_bytes: int) -> str | None:
    """Return a handler's result as the JSON text stored with its job (None for None).

    Python's JSON types, and what pydantic serialises (models, datetimes, UUIDs, ...), are JSON.
    Raises: `ResultError` for anything else, NaN or infinity, a NUL character or unpaired
    surrogate in a string (PostgreSQL's jsonb refuses them), or more than `max_bytes` bytes.
    """
    if value is None:
        return None
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False, default=to_jsonable_python)
        size = len(text.encode())
    except (TypeError, ValueError, RecursionError) as exc:
        raise ResultError(f"the result is not JSON: {describe(exc)}") from None
    if _NUL.search(text):
        raise ResultError("the result is not JSON that PostgreSQL stores: a string holds NUL")
    if size > max_bytes:
        raise ResultError(
            f"the result is {size} bytes of JSON, more than {max_bytes} (JOBQ_MAX_RESULT_BYTES)"
        )
    return text


def _storable(text: str) -> str:
    """`text` as PostgreSQL's `text` takes it: NUL and unpaired surrogates escaped."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode()


def trace(exc: BaseException) -> str:
    """Return the traceback of `exc` as text, its last `MAX_TRACEBACK_CHARS` characters."""
    text = _storable("".join(traceback.format_exception(exc)))
    return text if len(text) <= MAX_TRACEBACK_CHARS else "...\n" + text[-MAX_TRACEBACK_CHARS:]


def describe(exc: BaseException) -> str:
    """Return `Type: message` of an exception, cut to `MAX_ERROR_CHARS` (NUL and unpaired
    surrogates escaped: it is stored as text)."""
    text = f"{type(exc).__name__}: {exc}".rstrip(": ")
    return _storable(text)[:MAX_ERROR_CHARS]


def _text(detail: datetime | str | None) -> str | None:
    return detail if isinstance(detail, str) else None


class _TimedOut(Exception):
    """The attempt passed its time limit."""


class Executor:
    """Runs the claimed jobs of one worker; each attempt's outcome goes to `report(job,
    outcome)` (`Completer.report`), its run time in seconds to `ran(job_type, seconds)`. A hard
    stop cancels what can be cancelled with `cancel_handlers`."""

    def __init__(
        self,
        settings: Settings,
        handlers: Registry,
        state: dict[str, Any],
        report: Callable[[ClaimedJob, Outcome], None],
        ran: Callable[[str, float], None] = lambda job_type, seconds: None,
    ) -> None:
        self.settings = settings
        self.handlers = handlers
        self.state = state
        self._report = report
        self._ran = ran
        self._in_handler: set[asyncio.Task[Any]] = set()
        """The tasks a hard stop may cancel: an async handler running, or a sync one still
        waiting for a thread."""
        self._attempts: dict[int, tuple[asyncio.Task[Any], JobContext]] = {}
        """The attempts running, by job id (for `cancel`)."""
        self._cancel_asked: set[int] = set()
        """Jobs cancelled while this worker holds them: an attempt not begun yet ends before
        the handler is called; either way the outcome says it was cancelled."""
        self.worker_id = 0
        self._backoff = Backoff(
            settings.backoff_base, settings.backoff_max, settings.backoff_jitter
        )
        """The retry delays of handlers that declare none."""
        self._threads: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def open(self, worker_id: int) -> None:
        """Start the thread pool (`settings.max_threads`) for jobs of worker `worker_id`."""
        self.worker_id = worker_id
        self._loop = asyncio.get_running_loop()
        self._threads = ThreadPoolExecutor(
            self.settings.max_threads, thread_name_prefix="jobq-sync"
        )

    def close(self) -> None:
        """Stop the thread pool without waiting: a thread cannot be interrupted, and its job
        has been released already."""
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)

    def cancel_handlers(self) -> int:
        """Cancel the async handlers running and the sync ones still waiting for a thread (their
        jobs are released); return how many. A sync handler already in its thread cannot be."""
        for task in self._in_handler:
            task.cancel()
        return len(self._in_handler)

    def cancel(self, job_id: int) -> None:
        """The job `job_id`, which this worker claimed, was cancelled: set its attempt's
        `JobContext.cancelled`, and cancel its handler when it is async or still waiting for a
        thread (a thread cannot be stopped: its handler should check the flag). Its outcome,
        whatever it is, then ends the job `cancelled` (the database knows it is)."""
        self._cancel_asked.add(job_id)
        found = self._attempts.get(job_id)
        if found is None:
            return  # its attempt has not begun
        task, context = found
        context.cancelled.set()
        spec = self.handlers.get(context.job_type)
        if task in self._in_handler or (spec is not None and spec.is_async):
            task.cancel()

    async def execute(
        self, job: ClaimedJob, *, traced: bool = False, traceparent: str | None = None
    ) -> None:
        """Run one attempt of a claimed job and report its outcome (`report`).

        Cancelled (by `Worker.abort`, while an async handler runs or a sync one waits for a
        thread, or by `cancel`): the job is released, ripe now, with no attempt charged (a
        cancelled job ends `cancelled`). The attempt's run time goes to the metrics; when
        `traced` (`jobq.tracing.active()`), it runs in a span, the child of the enqueuing one
        (`traceparent`).
        """
        started = time.monotonic()
        span_of_attempt = (
            tracing.job_span(
                job_id=job.id,
                queue=job.queue,
                job_type=job.job_type,
                attempt=job.attempts + 1,
                traceparent=traceparent,
            )
            if traced
            else _NO_SPAN
        )
        with span_of_attempt as span:
            try:
                verdict, error, detail = await self._attempt(job)
            except asyncio.CancelledError:
                self._report(job, Outcome(job.token, Verdict.RELEASE))
                raise
            finally:
                self._attempts.pop(job.id, None)
                cancelled = job.id in self._cancel_asked
                self._cancel_asked.discard(job.id)
            if verdict is not Verdict.COMPLETE and verdict is not Verdict.SNOOZE:
                tracing.failed(span, error)
        run_time = time.monotonic() - started
        self._ran(job.job_type, run_time)
        if verdict is not Verdict.RELEASE:
            metrics.tally.observe(job.queue, job.job_type, "run_time", run_time)
        if verdict is Verdict.COMPLETE:
            assert detail is None or isinstance(detail, str)
            outcome = Outcome(job.token, Verdict.COMPLETE, result=detail, cancelled=cancelled)
        elif verdict is Verdict.SNOOZE:
            assert isinstance(detail, datetime)
            outcome = Outcome(job.token, Verdict.SNOOZE, ripe_at=detail, cancelled=cancelled)
        elif verdict is Verdict.RELEASE:
            outcome = Outcome(job.token, Verdict.RELEASE, cancelled=cancelled)
        elif verdict is Verdict.RETRY and job.attempts < job.max_retries:
            spec = self.handlers.get(job.job_type)
            backoff = spec.backoff if spec is not None and spec.backoff else self._backoff
            ripe_at = backoff.next_ripe_at(job.attempts + 1, clock.now())
            outcome = Outcome(
                job.token,
                Verdict.RETRY,
                ripe_at,
                error,
                traceback=_text(detail),
                cancelled=cancelled,
            )
        else:
            outcome = Outcome(
                job.token, Verdict.BURY, error=error, traceback=_text(detail), cancelled=cancelled
            )
        self._report(job, outcome)

    async def _attempt(self, job: ClaimedJob) -> Attempt:
        if job.id in self._cancel_asked:
            return Verdict.RELEASE, None, None  # cancelled: it ends `cancelled`
        spec = self.handlers.get(job.job_type)
        if spec is None:
            return Verdict.BURY, f"no handler for job_type {job.job_type!r}", None
        try:
            args = spec.args_model.model_validate(job.arguments)
        except ValidationError as exc:
            return Verdict.BURY, f"invalid arguments: {exc}"[:MAX_ERROR_CHARS], None
        assert self._loop is not None
        assert self.worker_id is not None
        context = JobContext(
            id=job.id,
            job_type=job.job_type,
            attempt=job.attempts + 1,
            max_retries=job.max_retries,
            worker_id=self.worker_id,
            queue=job.queue,
            state=self.state,
            loop=self._loop,
        )
        bind_job(context)  # its log lines carry the job (the attempt's task has its own Context)
        task = asyncio.current_task()
        assert task is not None
        self._attempts[job.id] = (task, context)
        limit = (spec.timeout or self.settings.job_timeout).total_seconds()
        try:
            if spec.is_async:
                returned = await self._run_on_loop(spec.fn, args, context, limit, task)
            else:
                returned = await self._run_in_thread(spec.fn, args, context, limit)
        except DontRetry as exc:
            return Verdict.BURY, describe(exc), trace(exc)
        except _TimedOut:
            return Verdict.RETRY, f"timed out after {limit:g}s", None
        except Snooze as exc:
            returned = exc
        except Exception as exc:
            log.warning(
                "job %s (%s) attempt %d failed: %s",
                job.id,
                job.job_type,
                context.attempt,
                describe(exc),
                exc_info=log.isEnabledFor(logging.DEBUG),
            )
            return Verdict.RETRY, describe(exc), trace(exc)
        if isinstance(returned, Snooze):
            return Verdict.SNOOZE, None, clock.now() + returned.delay
        try:
            return Verdict.COMPLETE, None, result_json(returned, self.settings.max_result_bytes)
        except ResultError as exc:
            return Verdict.BURY, str(exc), None

    async def _run_on_loop(
        self,
        fn: Callable[..., Any],
        args: Any,
        context: JobContext,
        limit: float,
        task: asyncio.Task[Any],
    ) -> Any:
        """Await an async handler under its timeout and return what it returns; a hard stop
        may cancel it (`task`: the attempt's, the current one)."""
        self._in_handler.add(task)
        try:
            async with asyncio.timeout(limit) as deadline:
                return await fn(args, context)
        except TimeoutError:
            if deadline.expired():
                raise _TimedOut() from None
            raise
        finally:
            self._in_handler.discard(task)

    async def _run_in_thread(
        self, fn: Callable[..., Any], args: Any, context: JobContext, limit: float
    ) -> Any:
        """Run a plain `def` handler in the thread pool and return what it returns.

        The timeout runs from the moment a thread starts it, not while it waits for a free
        thread. A thread cannot be stopped, so once it has started its job keeps its slot and
        lease until it returns, past its timeout and through a stop: no second run may start
        while this one lives (guarantee 3). Before it starts, a hard stop may cancel it.
        """
        assert self._loop is not None
        loop = self._loop
        started = asyncio.Event()
        run = contextvars.copy_context().run
        decided = threading.Lock()  # whether the thread starts or the job is withdrawn
        began = withdrawn = False

        def in_thread() -> Any:
            nonlocal began
            with decided:
                if withdrawn:
                    return None
                began = True
            loop.call_soon_threadsafe(started.set)
            return run(fn, args, context)

        thread = loop.run_in_executor(self._threads, in_thread)
        thread.add_done_callback(lambda _: started.set())
        task = asyncio.current_task()
        assert task is not None
        self._in_handler.add(task)
        try:
            await started.wait()
        except asyncio.CancelledError:
            with decided:
                withdrawn = not began
            if withdrawn:
                raise  # it will never start
            task.uncancel()  # it has started: it must be waited for
        finally:
            self._in_handler.discard(task)
        try:
            async with asyncio.timeout(limit):
                return await asyncio.shield(thread)
        except TimeoutError:
            if thread.done():
                raise  # the handler's own TimeoutError
            log.warning(
                "job %s (%s) passed its %gs timeout in a thread; waiting for it",
                context.id,
                context.job_type,
                limit,
            )
            await asyncio.gather(thread, return_exceptions=True)
            raise _TimedOut() from None
