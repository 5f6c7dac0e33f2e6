"""One base exception for jobq; each subclass's docstring is its default message.

The mapping to HTTP lives in `jobq.app` (one place); `status` and `code` are what it uses.
"""

from __future__ import annotations

from typing import Any


class JobqError(Exception):
    """Something went wrong in jobq."""

    status: int = 500
    code: str = "internal_error"

    def __init__(self, message: str | None = None, **data: Any) -> None:
        self.message = message or (self.__doc__ or self.code).strip()
        self.data = data
        super().__init__(self.message)


class NotFound(JobqError):
    """The resource does not exist."""

    status = 404
    code = "not_found"


class Conflict(JobqError):
    """The request conflicts with the resource's current state."""

    status = 409
    code = "conflict"


class DatabaseUnavailable(JobqError):
    """The database is not answering; try again shortly."""

    status = 503
    code = "database_unavailable"


class DontRetry(JobqError):
    """The job failed in a way that another attempt cannot fix; it goes to the dead letter."""

    code = "dont_retry"
