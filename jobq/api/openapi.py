"""The OpenAPI document's error responses: every operation documents the errors it can answer.

quart-schema documents each view's success model; `Provider` adds, from the shape of each
route, the JSON errors of `jobq.app`'s mapping (body: `Error`):

- 503 `database_unavailable` everywhere;
- 404 `not_found` on a route with an id in its path (unknown, or beyond bigint), and on the
  admin routes (no token configured);
- 401 `unauthorized` (with `WWW-Authenticate`) on routes with a security scheme;
- 413 `request_entity_too_large` everywhere (a body over the limit, whatever the method);
- 415 `unsupported_media_type` on POST, PUT and PATCH;
- 400 `bad_request` where a JSON body is read (malformed, not UTF-8, nested too deeply);
- 422 `validation_error` where a body or a query string is validated;

and, from `ENDPOINT_RESPONSES`, what only a view knows: its 409s, and answers that are not JSON
(204 with no content, iCalendar files).
"""

from __future__ import annotations

import copy
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from quart_schema import OpenAPIProvider
from werkzeug.routing import Rule

BODY_METHODS = {"post", "put", "patch"}

Extra = Literal["conflict", "no_content", "calendar"]

ENDPOINT_RESPONSES: dict[str, dict[int, Extra]] = {
    "users.create_user": {409: "conflict"},
    "reminders.delete_reminder": {204: "no_content", 409: "conflict"},
    "exports.get_export": {200: "calendar", 409: "conflict"},
    "exports.download_export": {200: "calendar", 409: "conflict"},
    "admin.retry_dead_job": {409: "conflict"},
    "admin.discard_dead_job": {204: "no_content"},
}
"""Per endpoint, the responses its route's shape does not tell: 409s, 204s, iCalendar files."""

ERRORS = {
    400: "`bad_request`: the body is not JSON, not UTF-8, or nested too deeply.",
    401: "`unauthorized`: the `Authorization: Bearer` token is missing or wrong.",
    404: "`not_found`: no such resource (or, on admin routes, no admin token configured).",
    409: "`conflict`: the request conflicts with the resource's current state.",
    413: "`request_entity_too_large`: the body is larger than `JOBQ_MAX_BODY_BYTES`.",
    415: "`unsupported_media_type`: a body that is not `application/json`.",
    422: "`validation_error`: `detail` lists the field-level errors.",
    503: "`database_unavailable`: the database is not answering; try again shortly.",
}


class Error(BaseModel):
    """The body of every error. `error`: a machine-readable code; `detail`: a message, a
    message with data (`{"message": ..., ...}`), or the field-level errors of a 422."""

    model_config = ConfigDict(extra="forbid")

    error: str
    detail: str | dict[str, Any] | list[dict[str, Any]]


ERROR_REF = {"$ref": "#/components/schemas/Error"}


def error_response(status: int) -> dict[str, Any]:
    """The response object of an error `status`, its body an `Error`."""
    response: dict[str, Any] = {
        "description": ERRORS[status],
        "content": {"application/json": {"schema": ERROR_REF}},
    }
    if status == 401:
        response["headers"] = {
            "WWW-Authenticate": {"required": True, "schema": {"type": "string"}},
        }
    return response


class Provider(OpenAPIProvider):
    """quart-schema's provider, plus every operation's error responses (see the module)."""

    def build_paths(self, rule: Rule) -> tuple[dict[str, Any], dict[str, Any]]:
        paths, components = super().build_paths(rule)
        extras = ENDPOINT_RESPONSES.get(rule.endpoint or "", {})
        for path_item in paths.values():
            for method, operation in path_item.items():
                # quart-schema shares one responses dict between the methods of a rule
                responses = copy.deepcopy(operation["responses"])
                for status in self._statuses(rule, method, operation):
                    responses.setdefault(status, error_response(status))
                for status, extra in extras.items():
                    self._add_extra(responses, status, extra)
                operation["responses"] = dict(sorted(responses.items()))
        components["Error"] = Error.model_json_schema()
        return paths, components

    @staticmethod
    def _statuses(rule: Rule, method: str, operation: dict[str, Any]) -> list[int]:
        statuses = [413, 503]
        secured = bool(operation.get("security"))
        if rule.arguments or secured:
            statuses.append(404)
        if secured:
            statuses.append(401)
        if method in BODY_METHODS:
            statuses.append(415)
        has_body = "requestBody" in operation
        if has_body:
            statuses.append(400)
        if has_body or any(p["in"] == "query" for p in operation["parameters"]):
            statuses.append(422)
        return statuses

    @staticmethod
    def _add_extra(responses: dict[int, Any], status: int, extra: Extra) -> None:
        if extra == "conflict":
            responses[status] = error_response(status)
        elif extra == "no_content":
            responses[status] = {"description": "Done; no content."}
        else:
            response = responses.setdefault(status, {"description": "", "content": {}})
            response["content"]["text/calendar"] = {"schema": {"type": "string"}}
            response["description"] = (
                response["description"] + " The iCalendar file (`text/calendar`) once done."
            ).strip()
