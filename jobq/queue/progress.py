"""Progress: a running job reports how far it has got (a fraction and a short message).

A report is written in place on the job's `job_running` row (no row per report), at most once
per `Settings.progress_interval` per job: a report that comes sooner waits, and only the latest
of those is written when the interval is up. `GET /jobs/{id}`, the dashboard, the command line
and `jobq.queue.control.watch` show it; those who await the job are woken by each write.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import timedelta

from jobq import clock
from jobq.config import Settings
from jobq.db import current_database
from jobq.queue import sql
from jobq.queue.model import JobContext

log = logging.getLogger("jobq.worker")

MAX_MESSAGE = 200
"""The longest message kept (characters); a longer one is cut."""

_TRACKED = 10_000
"""Jobs whose last report time this process remembers (the oldest are forgotten)."""


@dataclass
class _Reports:
    """One attempt's reports: when the last one was written (monotonic seconds), and the one
    waiting for its turn."""

    sent_at: float = -1e9
    pending: tuple[float | None, str | None] | None = None
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)


_reports: OrderedDict[tuple[int, int, int], _Reports] = OrderedDict()


_writing: set[asyncio.Task[None]] = set()
"""The writes of waiting reports in flight (held so that they are not collected)."""

DEFAULT_INTERVAL: timedelta = Settings.model_fields["progress_interval"].default


def _interval(job: JobContext) -> float:
    """The interval of the worker's settings (`JobContext.state["settings"]`), else the
    default."""
    settings = job.state.get("settings")
    chosen = settings.progress_interval if isinstance(settings, Settings) else DEFAULT_INTERVAL
    return chosen.total_seconds()


async def report_progress(
    job: JobContext, fraction: float | None, message: str | None = None
) -> bool:
    """Report that `job` is `fraction` done (0 to 1; None: unknown) with `message` (cut to 200
    characters). Written now when the last write of this attempt is older than the interval
    (return True), else the latest report is written when the interval is up (return False).
    Call it from an async handler; from a synchronous one, `report_progress_from_thread`.
    A failed write is logged, never raised: progress is for people, the job goes on.
    Raises: `ValueError` for a fraction outside 0 to 1."""
    if fraction is not None and not 0 <= fraction <= 1:
        raise ValueError(f"progress is a fraction from 0 to 1, not {fraction}")
    key = (job.worker_id, job.id, job.attempt)
    reports = _reports.get(key)
    if reports is None:
        reports = _reports[key] = _Reports()
        while len(_reports) > _TRACKED:
            _reports.popitem(last=False)
    text = None if message is None else message[:MAX_MESSAGE]
    wait = reports.sent_at + _interval(job) - time.monotonic()
    if wait <= 0 and reports.timer is None:
        reports.sent_at = time.monotonic()
        await _write(job, fraction, text)
        return True
    reports.pending = (fraction, text)
    if reports.timer is None:
        loop = asyncio.get_running_loop()
        reports.timer = loop.call_later(max(wait, 0), _write_pending, job, reports)
    return False


def report_progress_from_thread(
    job: JobContext, fraction: float | None, message: str | None = None
) -> bool:
    """`report_progress` from a synchronous handler's thread (it waits for the write, if the
    report is written now). Raises: as `report_progress`; `RuntimeError` on the loop's thread."""
    return job.run_coroutine(report_progress(job, fraction, message))


def _write_pending(job: JobContext, reports: _Reports) -> None:
    reports.timer = None
    if reports.pending is None:
        return
    fraction, text = reports.pending
    reports.pending = None
    reports.sent_at = time.monotonic()
    task = asyncio.get_running_loop().create_task(_write(job, fraction, text))
    _writing.add(task)
    task.add_done_callback(_writing.discard)


async def _write(job: JobContext, fraction: float | None, text: str | None) -> None:
    try:
        async with current_database().pool.acquire() as conn:
            await sql.job_progress_set.fetchval(
                conn,
                job_id=job.id,
                worker_id=job.worker_id,
                progress=fraction,
                message=text,
                now=clock.now(),
            )
    except Exception as exc:
        log.warning("job %s: progress not written (%s: %s)", job.id, type(exc).__name__, exc)
