"""The bodies of the API's error answers, one named model per shape (`jobq.api.openapi` puts
each on the statuses that answer with it; `jobq.app` writes them).

Every error body is `{"error": <code>, "detail": ...}`; `detail` has one shape per status:

- 404 `NotFoundError`: `{"message", <the id asked for>}` (`NotFoundDetail`);
- 409 `ConflictError`: `{"message", <what conflicts>}` (`ConflictDetail`);
- 422 `ValidationFailed`: the field-level errors, a list of `FieldError`;
- 429 `RateLimited`: `{"message", "retry_after_s"}` (`RateLimitDetail`);
- any other (400, 401, 405, 413, 415, 500, 503) `Error`: a message.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from jobq.queue.control import JobState

Absent = SkipJsonSchema[None]
"""An optional field: absent from the body when None (never `null`)."""


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Error(_Body):
    """An error whose `detail` is a message. `error`: `bad_request`, `unauthorized`,
    `method_not_allowed`, `request_entity_too_large`, `unsupported_media_type`,
    `internal_error` or `database_unavailable`."""

    error: str
    detail: str


class NotFoundDetail(_Body):
    """What was not found: a message, and the id of the resource asked for when the route
    names one."""

    message: str
    user_id: int | Absent = None
    reminder_id: int | Absent = None
    export_id: int | Absent = None
    key_id: int | Absent = None
    job_id: int | Absent = None
    workflow_id: int | Absent = None
    queue: str | Absent = None


class NotFoundError(_Body):
    """404: no such resource, or not the caller's (on admin routes: no admin token is
    configured)."""

    error: Literal["not_found"]
    detail: NotFoundDetail


class ConflictCode(StrEnum):
    """`conflict`: the request conflicts with the resource's state; `limit_reached`: a per-user
    limit (`detail.limit`)."""

    CONFLICT = "conflict"
    LIMIT_REACHED = "limit_reached"


class ConflictDetail(_Body):
    """Why the request conflicts: a message, the resource concerned and what stands in the
    way (each when it applies)."""

    message: str
    field: str | Absent = Field(default=None, description="the field whose value is taken")
    limit: int | Absent = Field(default=None, description="the per-user limit reached")
    resource: str | Absent = Field(
        default=None,
        description="what the limit counts: `api_keys`, `exports` or `export_bytes`",
    )
    reminder_id: int | Absent = None
    export_id: int | Absent = None
    job_id: int | Absent = None
    state: JobState | Absent = Field(default=None, description="the job's state")
    queued_job_id: int | Absent = Field(
        default=None, description="the queued job identical to the dead job to retry"
    )


class ConflictError(_Body):
    """409: the request conflicts with the resource's current state, or a limit is reached."""

    error: ConflictCode
    detail: ConflictDetail


class FieldError(_Body):
    """One field-level error: `loc` is the path to the field (names, and indexes in lists;
    empty for the body as a whole), `type` a machine-readable kind (pydantic's error types,
    and `unsafe_webhook`), `msg` a message."""

    type: str
    loc: list[str | int]
    msg: str


class ValidationFailed(_Body):
    """422: the body or the query string is invalid; `detail` lists why, field by field."""

    error: Literal["validation_error"]
    detail: list[FieldError]


class RateLimitDetail(_Body):
    """This API key's rate limit: retry after `retry_after_s` seconds."""

    message: str
    retry_after_s: int = Field(ge=1)


class RateLimited(_Body):
    """429: too many requests with this API key (`Retry-After` says when to retry)."""

    error: Literal["too_many_requests"]
    detail: RateLimitDetail


BY_STATUS: dict[int, type[BaseModel]] = {
    404: NotFoundError,
    409: ConflictError,
    422: ValidationFailed,
    429: RateLimited,
}
"""The model of each status whose body is not an `Error`."""


def model_of(status: int) -> type[BaseModel]:
    """The model of an error answer of `status`."""
    return BY_STATUS.get(status, Error)
