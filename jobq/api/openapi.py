"""The OpenAPI document, exact: every status each operation can answer, with its schema.

quart-schema documents each view's success model; `Provider` makes the rest exact:

- operation ids are the view functions' names (`get_user`), unique;
- every model is a named component (`User`, `Reminder`, `ReminderStatus`, ...), referenced
  wherever it is used, never written inline; each error status has its body's model
  (`jobq.api.problems`: `NotFoundError`, `ConflictError`, `ValidationFailed`, ...);
- from the shape of each route, the JSON errors of `jobq.app`'s mapping (body: `Error`):
  500 `internal_error` and 503 `database_unavailable` everywhere; 405 `method_not_allowed`
  everywhere (another method on the same path; `Allow` lists the path's methods); 408
  `request_timeout` and 413 `request_entity_too_large` everywhere; 404 `not_found` on a route
  with an id in its path, and on secured routes; 401 `unauthorized` (with `WWW-Authenticate`)
  and 429 `too_many_requests` (with `Retry-After`: a key's rate limit, or a client address's
  failed credentials) on secured routes; 415 `unsupported_media_type` on POST, PUT and PATCH;
  400 `bad_request` where a JSON body is read; 422 `validation_error` where a body or a query
  string is validated;
- from `ENDPOINT_RESPONSES`, what only a view knows: its 409s, 429s, 204s with no content,
  iCalendar files (`text/calendar`, a string: generated clients read it as text), the
  `Location` header of a 202, the 303 of an export asked for as a file.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel
from quart_schema import OpenAPIProvider
from quart_schema.validation import DataSource
from werkzeug.routing import Rule

from jobq.api import admin, problems
from jobq.config import Settings

BODY_METHODS = {"post", "put", "patch"}

Extra = Literal["conflict", "throttled", "no_content", "calendar", "location", "see_file", "signup"]

ENDPOINT_RESPONSES: dict[str, dict[int, Extra]] = {
    "users.create_user": {429: "throttled", 401: "signup"},
    "users.create_key": {409: "conflict"},
    "users.revoke_key": {204: "no_content"},
    "users.create_reminder": {409: "conflict"},
    "users.request_export": {202: "location", 409: "conflict"},
    "reminders.delete_reminder": {204: "no_content"},
    "exports.delete_export": {204: "no_content"},
    "exports.get_export": {303: "see_file"},
    "exports.download_export": {200: "calendar", 409: "conflict"},
    "admin.retry_dead_job": {409: "conflict"},
    "admin.retry_job": {409: "conflict"},
    "admin.cancel_job": {409: "conflict"},
    "reminders.pause_reminder": {409: "conflict"},
    "reminders.resume_reminder": {409: "conflict"},
    "admin.discard_dead_job": {204: "no_content"},
    "queues.pause_queue": {204: "no_content"},
    "queues.resume_queue": {204: "no_content"},
    "workflows.retry_workflow": {409: "conflict"},
}
"""Per endpoint, the responses its route's shape does not tell."""

ERRORS = {
    400: "`bad_request`: the body is not JSON, not UTF-8, or nested too deeply.",
    401: "`unauthorized`: the `Authorization: Bearer` token is missing or wrong.",
    404: "`not_found`: no such resource, or not the caller's (on admin routes: no admin "
    "token configured).",
    405: "`method_not_allowed`: the path exists, not with this method (`Allow` lists them).",
    408: "`request_timeout`: the body did not arrive within `JOBQ_BODY_TIMEOUT_S`.",
    409: "`conflict` (the request conflicts with the resource's current state) or "
    "`limit_reached` (a per-user limit; `detail.limit` gives it).",
    413: "`request_entity_too_large`: the body is larger than `JOBQ_MAX_BODY_BYTES`.",
    415: "`unsupported_media_type`: a body that is not `application/json`.",
    422: "`validation_error`: `detail` lists the field-level errors.",
    429: "`too_many_requests`: this API key's rate limit, or too many failed credentials (or "
    "sign-ups) from the client's address; retry after `Retry-After` seconds.",
    500: "`internal_error`: an unexpected error (logged).",
    503: "`database_unavailable`: the database is not answering; try again shortly.",
}

HEADERS = {
    401: {"WWW-Authenticate": {"required": True, "schema": {"type": "string"}}},
    405: {"Allow": {"required": True, "schema": {"type": "string"}}},
    429: {
        "Retry-After": {
            "required": True,
            "description": "seconds",
            "schema": {"type": "integer", "minimum": 1},
        }
    },
}


def _error_schemas() -> dict[str, Any]:
    """The components of the error bodies (`jobq.api.problems`), their nested models too."""
    schemas: dict[str, Any] = {}
    models: list[type[BaseModel]] = [problems.Error, *problems.BY_STATUS.values()]
    for model in models:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas |= schema.pop("$defs", {})
        schemas[model.__name__] = schema
    return schemas


ERROR_SCHEMAS = _error_schemas()


def error_response(status: int) -> dict[str, Any]:
    """The response object of an error `status`, its body the model of that status
    (`problems.model_of`)."""
    ref = f"#/components/schemas/{problems.model_of(status).__name__}"
    response: dict[str, Any] = {
        "description": ERRORS[status],
        "content": {"application/json": {"schema": {"$ref": ref}}},
    }
    if status in HEADERS:
        response["headers"] = copy.deepcopy(HEADERS[status])
    return response


def _named(schema: dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    """Move a model's inline schema to `components` under its title; return a reference."""
    title = schema.get("title")
    if not isinstance(title, str) or "properties" not in schema:
        return schema
    components[title] = schema
    return {"$ref": f"#/components/schemas/{title}"}


def _secured_by(operation: dict[str, Any]) -> set[str]:
    return {name for requirement in operation.get("security", []) for name in requirement}


class Provider(OpenAPIProvider):
    """quart-schema's provider, made exact (see the module)."""

    def operation_id(self, method: str, path: str, func: Callable[..., Any]) -> str | None:
        """The view function's name: `get_user`, `create_reminder` (unique: a test checks)."""
        return func.__name__

    def build_request_body(
        self, model: type[Any], source: DataSource
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        body, components = super().build_request_body(model, source)
        body["required"] = True
        for media in body["content"].values():
            media["schema"] = _named(media["schema"], components)
        return body, components

    def build_response_object(
        self, model: type[Any], headers_model: type[Any] | None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        response, components = super().build_response_object(model, headers_model)
        for media in response["content"].values():
            media["schema"] = _named(media["schema"], components)
        return response, components

    def build_paths(self, rule: Rule) -> tuple[dict[str, Any], dict[str, Any]]:
        paths, components = super().build_paths(rule)
        settings: Settings = self._app.extensions["jobq.settings"]
        extras = ENDPOINT_RESPONSES.get(rule.endpoint or "", {})
        for path_item in paths.values():
            for method, shared in path_item.items():
                # quart-schema shares one responses dict between the methods of a rule
                operation = copy.deepcopy(shared)
                path_item[method] = operation
                for status, extra in extras.items():
                    self._add_extra(operation, status, extra, settings)
                responses = operation["responses"]
                for status in self._statuses(rule, method, operation):
                    responses.setdefault(status, error_response(status))
                operation["responses"] = dict(sorted(responses.items()))
        components |= ERROR_SCHEMAS
        return paths, components

    @staticmethod
    def _statuses(rule: Rule, method: str, operation: dict[str, Any]) -> list[int]:
        statuses = [405, 408, 413, 500, 503]
        secured = _secured_by(operation)
        if rule.arguments or secured:
            statuses.append(404)
        if secured:
            statuses.append(401)
        if secured:  # a key's rate limit; any credential: its sender's failed attempts
            statuses.append(429)
        if method in BODY_METHODS:
            statuses.append(415)
        has_body = "requestBody" in operation
        if has_body:
            statuses.append(400)
        if has_body or any(p["in"] == "query" for p in operation["parameters"]):
            statuses.append(422)
        return statuses

    @staticmethod
    def _add_extra(
        operation: dict[str, Any], status: int, extra: Extra, settings: Settings
    ) -> None:
        responses = operation["responses"]
        calendar = {"text/calendar": {"schema": {"type": "string"}}}
        if extra in ("conflict", "throttled"):
            responses[status] = error_response(status)
        elif extra == "no_content":
            responses[status] = {"description": "Done; no content."}
        elif extra == "signup" and settings.signup == "admin":
            operation["security"] = [{admin.SECURITY_SCHEME: []}]
        elif extra == "location":
            responses[status]["headers"] = {
                "Location": {
                    "required": True,
                    "description": "the status URL (`status_url`)",
                    "schema": {"type": "string"},
                }
            }
        elif extra == "calendar":
            responses[status] = {
                "description": "The iCalendar file, once done.",
                "content": calendar,
            }
        elif extra == "see_file":
            responses[status] = {
                "description": "With `Accept: text/calendar` preferred: see the iCalendar file "
                "(`Location`: `/exports/<id>.ics`, after the wait if any).",
                "headers": {
                    "Location": {
                        "required": True,
                        "description": "the file's URL",
                        "schema": {"type": "string"},
                    }
                },
            }
            operation["parameters"].append(
                {
                    "name": "Accept",
                    "in": "header",
                    "required": False,
                    "description": "`text/calendar` (preferred over JSON): a 303 to the file; "
                    "JSON otherwise (any other value)",
                    "schema": {"type": "string"},
                }
            )
