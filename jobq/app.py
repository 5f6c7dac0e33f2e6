"""The application factory: blueprints, error handlers, and the resources' lifecycle.

Start: database (embedded server when `DATABASE_URL` is unset; migrations), pool, HTTP client,
then the worker. Stop, in reverse: the worker (graceful: drain, then release), the HTTP client,
the pool last. Hypercorn serves `jobq.app:create_app()`; `python -m jobq serve` does it with the
settings' address.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

import asyncpg
from pydantic import ValidationError
from quart import Quart, Response, request
from quart_schema import Info, QuartSchema, RequestSchemaValidationError
from werkzeug.exceptions import HTTPException, NotFound
from werkzeug.routing import BaseConverter, IntegerConverter

from jobq import db, jobs, tracing
from jobq.api import (
    admin,
    auth,
    docs,
    exports,
    health,
    metrics,
    openapi,
    queues,
    reminders,
    users,
)
from jobq.api import jobs as jobs_api
from jobq.api import workflows as workflows_api
from jobq.api.throttle import Throttles
from jobq.config import Settings
from jobq.dashboard.blueprint import bp as dashboard_bp
from jobq.db import Database
from jobq.domain.types import BIGINT_MAX
from jobq.errors import OBJECT_DETAIL_STATUSES, DatabaseUnavailable, JobqError, TooManyRequests
from jobq.migrate import prepare
from jobq.queue import Worker
from jobq.queue import metrics as queue_metrics

log = logging.getLogger(__name__)

JSON_TYPES = ("POST", "PUT", "PATCH")

DATABASE_DOWN = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.TooManyConnectionsError,
)
"""Errors that mean the database is unreachable (mapped to 503), not that a request is wrong."""


HTML_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
}
"""Headers every HTML answer gets unless its view set its own (`Content-Security-Policy`)."""


def database_down(exc: BaseException) -> bool:
    """True when `exc` means that the database is unreachable or went away (503), not that the
    request or the code is wrong (500): one of `DATABASE_DOWN`, or asyncpg's bare
    `InternalClientError`.

    asyncpg raises the latter ("cannot switch to state 15; another operation (2) is in
    progress") when a statement starts on a pooled connection whose server has just ended the
    session: the server's FATAL error (57P01 on a fast shutdown or `pg_terminate_backend`), read
    while the connection was idle, leaves the protocol in its error state, and the socket's
    close, which marks the connection closed, is read a turn of the event loop or two later.
    The connection is then aborted and the pool replaces it. Its subclasses (`ProtocolError`,
    `OutdatedSchemaCacheError`, `TargetServerAttributeNotMatched`) are about the data or the
    configuration, not a lost connection: they stay 500.
    """
    return isinstance(exc, DATABASE_DOWN) or type(exc) is asyncpg.InternalClientError


def error_body(code: str, detail: Any, status: int) -> Response:
    """The JSON error every failure answers with: `{"error": code, "detail": detail}`."""
    return Response(
        json.dumps({"detail": detail, "error": code}, default=str, separators=(",", ":")) + "\n",
        status=status,
        content_type="application/json",
    )


class IdConverter(IntegerConverter):
    """`<int:...>` in routes: ASCII digits only (Werkzeug's `\\d` also takes `²` or Arabic-Indic
    digits, which name no row), so another spelling matches no route (404). A number beyond
    PostgreSQL's bigint names no row either, so it is a 404 here rather than a database error.
    (Raised, not a conversion failure: that would let Werkzeug answer 405 where another
    method's rule has the same path.)"""

    regex = r"[0-9]+"

    def to_python(self, value: str) -> int:
        number: int = super().to_python(value)
        if number > BIGINT_MAX:
            raise NotFound()
        return number


class QueueNameConverter(BaseConverter):
    """`<queue:...>` in routes: a queue's name as queues are declared (`QUEUE_NAME`); anything
    else (a NUL, upper case, 64 characters or more) names no queue and matches no route (404)."""

    regex = r"[a-z][a-z0-9_.:-]{0,62}"


def _snake(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name.lower()).strip("_")


def _register_errors(app: Quart) -> None:
    """The one mapping from exceptions to HTTP answers."""

    @app.errorhandler(RequestSchemaValidationError)
    async def invalid_body(exc: RequestSchemaValidationError) -> Response:
        cause = exc.validation_error
        if isinstance(cause, ValidationError):
            detail: Any = cause.errors(
                include_url=False, include_context=False, include_input=False
            )
        else:
            detail = [{"type": "invalid", "loc": [], "msg": str(cause)}]
        return error_body("validation_error", detail, 422)

    @app.errorhandler(JobqError)
    async def jobq_error(exc: JobqError) -> Response:
        response = error_body(exc.code, exc.detail(), exc.status)
        if isinstance(exc, TooManyRequests):
            response.headers["Retry-After"] = str(exc.data["retry_after_s"])
        return response

    @app.errorhandler(HTTPException)
    async def http_error(exc: HTTPException) -> Response:
        detail: Any = exc.description
        if exc.code in OBJECT_DETAIL_STATUSES:
            detail = {"message": detail}
        response = error_body(_snake(exc.name), detail, exc.code or 500)
        for name, value in exc.get_headers():  # e.g. Allow on a 405 (RFC 9110, 15.5.6)
            if name.lower() != "content-type":
                response.headers[name] = value
        return response

    @app.errorhandler(UnicodeDecodeError)
    async def not_utf8(exc: UnicodeDecodeError) -> Response:
        return error_body("bad_request", "the body is not valid UTF-8", 400)

    @app.errorhandler(RecursionError)
    async def too_deep(exc: RecursionError) -> Response:
        return error_body("bad_request", "the JSON body is nested too deeply", 400)

    @app.errorhandler(Exception)
    async def unexpected(exc: Exception) -> Response:
        if database_down(exc):
            log.warning("database unavailable: %s", type(exc).__name__)
            return await jobq_error(DatabaseUnavailable())
        log.exception("unhandled error")
        return error_body("internal_error", "an unexpected error occurred", 500)


def create_app(settings: Settings | None = None) -> Quart:
    """Build the app. `settings` defaults to `Settings()` (the environment and `.env`)."""
    settings = settings or Settings()
    app = Quart("jobq")
    app.url_map.converters["int"] = IdConverter  # before the blueprints add their routes
    app.url_map.converters["queue"] = QueueNameConverter
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.config["BODY_TIMEOUT"] = settings.body_timeout.total_seconds()  # 408 past it
    app.extensions["jobq.settings"] = settings
    QuartSchema(
        app,
        info=Info(title="jobq", version="0.1.0"),
        # its pages load scripts from CDNs: /docs is jobq's own (jobq.api.docs)
        swagger_ui_path=None,
        redoc_ui_path=None,
        scalar_ui_path=None,
        openapi_provider_class=openapi.Provider,  # documents every error response
        security_schemes={
            admin.SECURITY_SCHEME: {"type": "http", "scheme": "bearer"},
            auth.SECURITY_SCHEME: {"type": "http", "scheme": "bearer"},
        },
    )
    for blueprint in (
        users.bp,
        reminders.bp,
        exports.bp,
        jobs_api.bp,
        health.bp,
        admin.bp,
        queues.bp,
        metrics.bp,
        workflows_api.bp,
        docs.bp,
        dashboard_bp,
    ):
        app.register_blueprint(blueprint)
    _register_errors(app)
    tracing.instrument_app(app)  # a span per request, with the `otel` extra

    @app.after_request
    async def html_headers(response: Response) -> Response:
        # Every HTML page gets a policy: its own (the dashboard's, the docs'), else the
        # strictest, which lets the page load nothing at all.
        if response.mimetype == "text/html":
            for name, value in HTML_HEADERS.items():
                response.headers.setdefault(name, value)
        return response

    @app.before_serving
    async def start() -> None:
        # A serving's state starts afresh at each start: the per-key rate limits, the key
        # cache and the client addresses' throttles.
        app.extensions["jobq.rate_limiter"] = auth.rate_limiter(settings)
        app.extensions["jobq.key_cache"] = auth.key_cache()
        app.extensions["jobq.throttles"] = Throttles.of(settings)
        stack = contextlib.AsyncExitStack()
        app.extensions["jobq.stack"] = stack
        dsn = await prepare(settings)
        database = await Database.open(settings, dsn)
        stack.push_async_callback(database.close)  # closed last
        app.extensions["jobq.db"] = database
        db.bind(database)
        state = await stack.enter_async_context(jobs.job_state(settings))
        if settings.run_workers:
            worker = Worker(database, settings, state=state)
            await worker.start()
            stop = asyncio.Event()
            task = asyncio.create_task(worker.run(stop))
            app.extensions["jobq.worker"] = worker

            async def stop_worker() -> None:
                stop.set()
                await task

            stack.push_async_callback(stop_worker)  # stopped first
        else:  # the worker flushes the metrics of its process; here, its enqueues and cancels
            flusher = queue_metrics.flusher(database, settings.metrics_flush_interval)
            stop_flushing = asyncio.Event()
            flushing = asyncio.create_task(flusher.run(stop_flushing))

            async def last_flush() -> None:
                stop_flushing.set()
                await flushing
                await flusher.run_once()

            stack.push_async_callback(last_flush)

    @app.after_serving
    async def stop() -> None:
        await app.extensions["jobq.stack"].aclose()

    @app.before_request
    async def bind_database() -> Response | None:
        db.bind(app.extensions["jobq.db"])
        # Read the body, whatever the method and whether the view wants it: beyond
        # MAX_CONTENT_LENGTH that raises 413, beyond BODY_TIMEOUT 408 (a view that ignores
        # bodies would otherwise run, and a slow sender hold its connection).
        # Read rather than trust Content-Length: a chunked HTTP/1.1 or an HTTP/2 request has a
        # body without one.
        body = await request.get_data()
        form = request.blueprint == dashboard_bp.name  # its pages post HTML forms
        if request.method in JSON_TYPES and body and not request.is_json and not form:
            return error_body("unsupported_media_type", "send the body as application/json", 415)
        return None

    return app
