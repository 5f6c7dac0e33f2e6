"""Log lines: text (the default) or JSON, one object per line (`JOBQ_LOG_FORMAT=json`).

A JSON line holds `time` (ISO 8601 UTC with `Z`, milliseconds), `level`, `logger`, `message`,
`exception` (the traceback) when one is logged, and the job the line is about when there is
one: `job_id`, `queue`, `job_type`, `attempt` (1 for the first) and `worker_id`, so that logs can
be joined with metrics and traces on these keys. The job comes from `current_job`, which the
worker sets for each attempt (its task has a context of its own, and a synchronous handler's
thread runs in a copy of it), or from the `extra` of a logging call
(`log.info(..., extra={"job_id": 7})`); `JobFields` puts it on every record a handler sees.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar, Token
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

JOB_FIELDS = ("job_id", "queue", "job_type", "attempt", "worker_id")
"""The keys of the job a log line is about, in the order a JSON line gives them."""

current_job: ContextVar[Mapping[str, Any] | None] = ContextVar("jobq_current_job", default=None)
"""The job whose attempt runs in this context (keys of `JOB_FIELDS`), or None."""


class Attempt(Protocol):
    """What names an attempt: `jobq.queue.model.JobContext` is one."""

    @property
    def id(self) -> int: ...
    @property
    def queue(self) -> str: ...
    @property
    def job_type(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def worker_id(self) -> int: ...


def job_fields(attempt: Attempt) -> dict[str, Any]:
    """The `JOB_FIELDS` of `attempt`."""
    return {
        "job_id": attempt.id,
        "queue": attempt.queue,
        "job_type": attempt.job_type,
        "attempt": attempt.attempt,
        "worker_id": attempt.worker_id,
    }


def bind_job(attempt: Attempt) -> Token[Mapping[str, Any] | None]:
    """Make the log lines of the rest of this context carry `attempt`'s fields; return the token
    that `current_job.reset` takes. For a context that is the attempt's alone (a task of its
    own); elsewhere use `job_log_context`."""
    return current_job.set(job_fields(attempt))


@contextmanager
def job_log_context(attempt: Attempt) -> Iterator[None]:
    """Within the block, log lines carry `attempt`'s fields; afterwards, what they carried."""
    token = bind_job(attempt)
    try:
        yield
    finally:
        current_job.reset(token)


class JobFields(logging.Filter):
    """Puts the fields of `current_job` on each record (those given by `extra` stay)."""

    def filter(self, record: logging.LogRecord) -> bool:
        job = current_job.get()
        if job is not None:
            for key in JOB_FIELDS:
                if key in job and not hasattr(record, key):
                    setattr(record, key, job[key])
        return True


class JsonFormatter(logging.Formatter):
    """Formats a record as one line of JSON (see the module for its keys)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in JOB_FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def configure(level: str, log_format: Literal["text", "json"]) -> None:
    """Send the log to stderr at `level` (`INFO`, ...), as `TEXT_FORMAT` lines or as JSON lines
    (`JsonFormatter`), each record with its job's fields (`JobFields`); like
    `logging.basicConfig`, only when the root logger has no handler yet.
    Raises: `ValueError` for an unknown level."""
    handler = logging.StreamHandler()
    handler.addFilter(JobFields())
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    logging.basicConfig(level=level.upper(), handlers=[handler])
