"""Tracing with OpenTelemetry: the optional extra `otel` (`pip install 'jobq[otel]'`).

Without the extra nothing of OpenTelemetry is imported or run: `INSTALLED` is False and every
function here returns at once. With it, jobq uses the global tracer provider, which the
application configures (or `opentelemetry-instrument python -m jobq run`, from the `OTEL_*`
environment variables); until one is set, `active()` is False and nothing is written or read.

- HTTP requests get a server span each (`instrument_app`: the ASGI middleware of
  `opentelemetry-instrumentation-asgi`), from the caller's `traceparent` header if any.
- An enqueue inside a span stores the span's W3C trace context with the job (`remember`, into
  the side table `job_trace`: the statements that move a job between tables stay as they are).
- A worker reads the trace contexts of the jobs it claims in one batch per claim (`recall`) and
  runs each attempt in a span (`job_span`, kind CONSUMER) that is a child of the enqueuing
  span, with the job's id, queue, type and attempt as attributes.
- The webhook calls are traced by `opentelemetry-instrumentation-aiohttp-client`
  (`client_trace_configs`): client spans, children of the handler's span, and a `traceparent`
  header to the receiver.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from jobq.db import Connection, Database
from jobq.queue import sql

log = logging.getLogger("jobq.worker")

try:
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the `otel` extra is not installed
    INSTALLED = False
else:
    INSTALLED = True
    _propagator = TraceContextTextMapPropagator()
    _UNSET = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)

SPAN_NAME = "jobq.job {job_type}"
"""The name of a job attempt's span."""


def active() -> bool:
    """Whether spans are recorded: the extra is installed and a tracer provider is set."""
    if not INSTALLED:
        return False
    return not isinstance(trace.get_tracer_provider(), _UNSET)


def current_traceparent() -> str | None:
    """The W3C `traceparent` of the span current here, or None (no span, or not tracing)."""
    if not active():
        return None
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent")


async def remember(conn: Connection, job_ids: Sequence[int], *, now: datetime) -> None:
    """Store the current span's trace context with the jobs `job_ids` just enqueued on `conn`
    (in the enqueue's transaction); nothing when no span is current or tracing is off."""
    traceparent = current_traceparent() if job_ids else None
    if traceparent is not None:
        await sql.job_trace_add.execute(
            conn, job_ids=list(job_ids), traceparent=traceparent, now=now
        )


async def recall(database: Database, job_ids: Sequence[int]) -> dict[int, str]:
    """Return the stored `traceparent` of each of `job_ids` that has one: none when tracing
    is off (no query then), or when they cannot be read (logged; the jobs then run in spans of
    their own)."""
    if not job_ids or not active():
        return {}
    try:
        async with database.pool.acquire() as conn:
            rows = await sql.job_trace_of.fetch(conn, job_ids=list(job_ids))
    except Exception as exc:
        log.warning("could not read trace contexts (%s: %s)", type(exc).__name__, exc)
        return {}
    return {r["job_id"]: r["traceparent"] for r in rows}


@contextlib.contextmanager
def job_span(
    *, job_id: int, queue: str, job_type: str, attempt: int, traceparent: str | None
) -> Iterator[Any]:
    """Run the block (one attempt of a job) in a span named `jobq.job <job_type>`, the child of
    the span that enqueued the job (`traceparent`; None: a root span), with the attributes
    `jobq.job.id`, `jobq.job.queue`, `jobq.job.type` and `jobq.job.attempt`; yield the span.
    Call it only while `active()` (the worker asks once per claim)."""
    parent = _propagator.extract({"traceparent": traceparent}) if traceparent else None
    with trace.get_tracer("jobq").start_as_current_span(
        SPAN_NAME.format(job_type=job_type),
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        attributes={
            "jobq.job.id": job_id,
            "jobq.job.queue": queue,
            "jobq.job.type": job_type,
            "jobq.job.attempt": attempt,
        },
    ) as span:
        yield span


def failed(span: Any, error: str | None) -> None:
    """Mark `span` (from `job_span`) failed with `error` (its attempt failed)."""
    if span is not None:
        span.set_status(trace.Status(trace.StatusCode.ERROR, error))


def instrument_app(app: Any) -> None:
    """Give every HTTP request of the Quart `app` a server span (ASGI middleware), except
    `/health` and `/metrics`, while `active()`; nothing without the extra. A request served
    while no tracer provider is set skips the middleware, which otherwise wraps every request,
    its headers and its messages even when its spans record nothing."""
    if not INSTALLED:
        return
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware

    untraced = app.asgi_app
    traced = OpenTelemetryMiddleware(untraced, excluded_urls="/health,/metrics")

    async def asgi_app(scope: Any, receive: Any, send: Any) -> None:
        await (traced if active() else untraced)(scope, receive, send)

    app.asgi_app = asgi_app


def client_trace_configs() -> list[Any] | None:
    """The `trace_configs` of the webhook client (`jobq.domain.webhooks.webhook_client`):
    `opentelemetry-instrumentation-aiohttp-client`'s (a client span per call, and a
    `traceparent` header to the server; its URL attribute is the origin alone, without the
    path, query or credentials) if spans are recorded now (`active()`: call it once the
    tracer provider is set, as `opentelemetry-instrument` does before the app starts); None
    otherwise: an instrumented client pays for its hooks on every call even when nothing is
    recorded."""
    if not active():
        return None
    from opentelemetry.instrumentation.aiohttp_client import create_trace_config

    return [create_trace_config(url_filter=lambda url: str(url.origin()))]
