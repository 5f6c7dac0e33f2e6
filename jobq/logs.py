"""Log lines: text (the default) or JSON, one object per line (`JOBQ_LOG_FORMAT=json`).

Neither leaks nor lies. Every URL in a line is cut to `scheme://host[:port]` (`RedactUrls`):
no credentials, path or query string of a webhook reaches the log, httpx's own request lines
included (its logger has the filter too, whatever handler takes its records). A text line
escapes the control characters of its message (`\\n`, `\\x1b`, ...: `escape`), the access
log's included, so an untrusted value (a URL path, a message) cannot start a line of its own;
a traceback's lines are indented, so every line at column 0 is a record's first. JSON lines
escape by their nature.

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
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar, Token
from datetime import UTC, datetime
from typing import IO, Any, Literal, Protocol

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_URL = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*)://([^\s\"'<>]*)")
_HOST = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[\w.%-]*)(:[0-9]*)?")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}

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


def _origin(url: re.Match[str]) -> str:
    authority = re.split(r"[/?#\\]", url.group(2), maxsplit=1)[0]
    host = authority.rpartition("@")[2]
    if not _HOST.fullmatch(host):  # not a host[:port]: perhaps `user:password/...@host`
        host = "..."
    return f"{url.group(1)}://{host}"


def redact_urls(text: str) -> str:
    """`text` with each URL cut to its scheme, host and port (`http://u:p@h:8080/a?t=1` reads
    `http://h:8080`): its user information, path, query and fragment never reach a log."""
    return _URL.sub(_origin, text) if "://" in text else text


def escape(text: str) -> str:
    """`text` with its control characters escaped (`\\n`, `\\r`, `\\t`, else `\\xNN` or
    `\\uNNNN`; the Unicode line and paragraph separators too): one line, however hostile."""

    def one(found: re.Match[str]) -> str:
        char = found.group()
        named = _NAMED.get(char)
        if named is not None:
            return named
        return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"

    return _CONTROL.sub(one, text)


class RedactUrls(logging.Filter):
    """Cuts every URL of a record's message to its origin (`redact_urls`); the record's
    arguments are merged into its message when that changes it."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact_urls(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


class TextFormatter(logging.Formatter):
    """`TEXT_FORMAT` lines whose message is escaped (`escape`) and whose traceback, if any, is
    indented by two spaces."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        return super().formatMessage(
            logging.makeLogRecord({**record.__dict__, "message": escape(record.message)})
        )

    def formatException(self, ei: Any) -> str:
        return _indent(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return _indent(super().formatStack(stack_info))


def _indent(text: str) -> str:
    return "\n".join(f"  {escape(line)}" for line in text.splitlines())


LIBRARY_LOGGERS = ("httpx", "httpcore")
"""Loggers of the libraries that log URLs (httpx: each request's, at INFO)."""


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
    """Send the log to stderr at `level` (`INFO`, ...), as escaped text lines (`TextFormatter`)
    or as JSON lines (`JsonFormatter`), each record with its job's fields (`JobFields`) and its
    URLs cut to their origin (`RedactUrls`); like `logging.basicConfig`, only when the root
    logger has no handler yet.
    Raises: `ValueError` for an unknown level."""
    logging.basicConfig(level=level.upper(), handlers=[stream_handler(log_format)])


def stream_handler(
    log_format: Literal["text", "json"], stream: IO[str] | None = None
) -> logging.Handler:
    """The handler `configure` installs: to `stream` (default stderr), each record with its
    job's fields and its URLs cut to their origin, as a text or a JSON line."""
    handler = logging.StreamHandler(stream)
    handler.addFilter(JobFields())
    handler.addFilter(RedactUrls())
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    return handler


def _protect_library_loggers() -> None:
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactUrls) for f in logger.filters):
            logger.addFilter(RedactUrls())


_protect_library_loggers()  # at import: before any webhook is called, whoever logs
