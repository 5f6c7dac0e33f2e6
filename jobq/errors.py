"""One base exception for jobq; each subclass's docstring is its default message.

The mapping to HTTP lives in `jobq.app` (one place); `status` and `code` are what it uses.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

OBJECT_DETAIL_STATUSES = (404, 409)
"""The statuses whose `detail` is always an object with a `message` (and the ids concerned)."""


class JobqError(Exception):
    """Something went wrong in jobq."""

    status: int = 500
    code: str = "internal_error"

    def __init__(self, message: str | None = None, **data: Any) -> None:
        self.message = message or (self.__doc__ or self.code).strip()
        self.data = data
        super().__init__(self.message)

    def detail(self) -> Any:
        """The `detail` of the JSON error (`jobq.api.problems`): `{"message": ..., **data}`
        for a 404 or a 409, or when there is data; else the message alone."""
        if self.data or self.status in OBJECT_DETAIL_STATUSES:
            return {"message": self.message, **self.data}
        return self.message


class NotFound(JobqError):
    """The resource does not exist."""

    status = 404
    code = "not_found"


class Conflict(JobqError):
    """The request conflicts with the resource's current state."""

    status = 409
    code = "conflict"


class DuplicateJob(JobqError):
    """A twin of the job is queued or running (its `Unique` says to raise): `job_id` is the
    twin's id."""

    status = 409
    code = "duplicate_job"


class DatabaseUnavailable(JobqError):
    """The database is not answering; try again shortly."""

    status = 503
    code = "database_unavailable"


class DontRetry(JobqError):
    """The job failed in a way that another attempt cannot fix; it goes to the dead letter."""

    code = "dont_retry"


class Snooze(Exception):
    """Raised (or returned) by a handler: run the job again `seconds` from now, charging no
    attempt (its lease is released at once). Raises: `ValueError` for `seconds` < 0."""

    def __init__(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"snooze for {seconds} s: it must be >= 0")
        super().__init__(f"snoozed for {seconds:g} s")
        self.delay = timedelta(seconds=seconds)


class LimitReached(JobqError):
    """A per-user limit is reached."""

    status = 409
    code = "limit_reached"


class TooManyRequests(JobqError):
    """Too many requests with this API key; retry after `retry_after_s` seconds."""

    status = 429
    code = "too_many_requests"


class UnsafeWebhook(JobqError):
    """The webhook URL may not be used."""

    status = 422
    code = "validation_error"

    def detail(self) -> Any:
        """A field-level error of `webhook_url`, like the other 422s."""
        return [{"type": "unsafe_webhook", "loc": ["webhook_url"], "msg": self.message}]


class InvalidRecurrence(JobqError):
    """The recurrence cannot be used."""

    status = 422
    code = "validation_error"

    def detail(self) -> Any:
        """A field-level error of `recurrence`, like the other 422s."""
        return [{"type": "value_error", "loc": ["recurrence"], "msg": self.message}]


class CrossSiteRefused(JobqError):
    """A state-changing request without this site's CSRF token, or from another origin."""

    status = 403
    code = "csrf_failed"


class InvalidWorkflow(JobqError):
    """The workflow cannot be enqueued: a step waits for one it does not have, or its steps
    wait for each other in a cycle (the message names them)."""

    status = 422
    code = "invalid_workflow"
