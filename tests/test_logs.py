"""`jobq.logs`: JSON log lines, and the job fields they carry from `current_job`."""

from __future__ import annotations

import asyncio
import contextvars
import io
import json
import logging
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from jobq.logs import JobFields, JsonFormatter, bind_job, current_job, job_log_context
from jobq.queue.model import JobContext

Lines = Callable[[], list[dict[str, Any]]]


@pytest.fixture
def logged() -> Iterator[tuple[logging.Logger, Lines]]:
    """A logger of its own whose handler is set up as `jobq.logs.configure` sets the root's,
    and the JSON lines it wrote so far."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(JobFields())
    handler.setFormatter(JsonFormatter())
    log = logging.getLogger("jobq.test_logs")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    yield log, lambda: [json.loads(line) for line in out.getvalue().splitlines()]
    log.removeHandler(handler)


async def attempt(job_id: int = 7) -> JobContext:
    """The context of attempt 2 of job `job_id` (`cli.test`, queue `bulk`) on worker 3."""
    return JobContext(
        id=job_id,
        job_type="cli.test",
        attempt=2,
        max_retries=5,
        worker_id=3,
        queue="bulk",
        state={},
        loop=asyncio.get_running_loop(),
    )


JOB = {"job_id": 7, "queue": "bulk", "job_type": "cli.test", "attempt": 2, "worker_id": 3}


async def test_a_line_is_one_json_object_with_the_job_of_its_context(
    logged: tuple[logging.Logger, Lines],
) -> None:
    log, lines = logged
    log.info("before %s", "any job")
    with job_log_context(await attempt()):
        log.warning("delivered in %d ms", 12)
    log.info("after")

    before, during, after = lines()
    assert set(before) == {"time", "level", "logger", "message"}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", before["time"])
    assert (before["level"], before["logger"]) == ("INFO", "jobq.test_logs")
    assert before["message"] == "before any job"
    assert during == {
        "time": during["time"],
        "level": "WARNING",
        "logger": "jobq.test_logs",
        "message": "delivered in 12 ms",
        **JOB,
    }
    assert "job_id" not in after
    assert current_job.get() is None


async def test_extra_fields_win_and_exceptions_come_whole(
    logged: tuple[logging.Logger, Lines],
) -> None:
    log, lines = logged
    with job_log_context(await attempt()):
        log.info("about another job", extra={"job_id": 99})
        try:
            1 / 0  # noqa: B018
        except ZeroDivisionError:
            log.exception("failed")
    about, failed = lines()
    assert about["job_id"] == 99
    assert about["worker_id"] == 3
    assert failed["exception"].startswith("Traceback (most recent call last):")
    assert failed["exception"].endswith("ZeroDivisionError: division by zero")


async def test_the_job_follows_into_a_thread_and_stays_in_its_task(
    logged: tuple[logging.Logger, Lines],
) -> None:
    log, lines = logged

    async def one_attempt() -> None:
        bind_job(await attempt(8))  # the attempt's task has a context of its own
        run = contextvars.copy_context().run  # as the executor starts a sync handler
        thread = threading.Thread(target=run, args=(log.info, "in the thread"))
        thread.start()
        await asyncio.to_thread(thread.join)

    await asyncio.get_running_loop().create_task(one_attempt(), context=contextvars.Context())
    log.info("outside")
    in_thread, outside = lines()
    assert in_thread == {**in_thread, **JOB, "job_id": 8, "message": "in the thread"}
    assert "job_id" not in outside
