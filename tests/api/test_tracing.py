"""Tracing (the `otel` extra, installed by `dev`): the request that enqueues a reminder, the
handler's span that delivers it (a child, in the same trace, with the job's attributes), and the
webhook call (a client span of the httpx instrumentation, its `traceparent` sent to the
receiver); no span holds the user's key or the webhook secret. Spans go to the SDK's in-memory
exporter; without a tracer provider nothing is stored with the jobs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from opentelemetry.util._once import Once
from quart.typing import TestClientProtocol as Client

from jobq import tracing
from jobq.config import Settings
from jobq.db import Connection
from jobq.domain.reminders import QUEUE, SEND_REMINDER
from tests.api.helpers import create_reminder, create_user
from tests.conftest import make_settings
from tests.toolkit.procs import eventually
from tests.toolkit.receiver import WebhookReceiver


@pytest.fixture
def settings(database_url: str) -> Settings:
    return make_settings(database_url, run_workers=True)  # the app's worker delivers


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The spans finished while the test runs (a tracer provider set for it alone)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    yield exporter
    provider.shutdown()
    # Forget the provider, as OpenTelemetry's own test utilities do: later tests run untraced.
    trace._TRACER_PROVIDER = None
    trace._TRACER_PROVIDER_SET_ONCE = Once()


def one(spans: list[ReadableSpan], what: str) -> ReadableSpan:
    assert len(spans) == 1, (what, [s.name for s in spans])
    return spans[0]


async def test_the_handler_span_is_a_child_of_the_enqueuing_request(
    spans: InMemorySpanExporter,
    client: Client,
    receiver: WebhookReceiver,
    conn: Connection,
    settings: Settings,
) -> None:
    assert tracing.active()
    user = await create_user(client, webhook_url=receiver.url)
    reminder = await create_reminder(client, user["id"], message="hi", remind_in_seconds=0.1)
    await receiver.wait_for(1)

    def handler_spans() -> list[ReadableSpan]:  # named by the job type the reminder enqueued
        return [s for s in spans.get_finished_spans() if s.name == f"jobq.job {SEND_REMINDER}"]

    try:
        found = await eventually(handler_spans, within=30, what="the handler's span")
    except AssertionError as exc:
        names = [(s.name, s.kind) for s in spans.get_finished_spans()]
        raise AssertionError(f"{exc}; finished spans: {names}") from None
    handler = one(found, "job")
    finished = spans.get_finished_spans()
    path = f"/users/{user['id']}/reminders"
    request = one(
        [s for s in finished if s.kind is SpanKind.SERVER and s.name == f"POST {path}"],
        "the request that enqueued",
    )
    assert handler.context is not None
    assert request.context is not None
    assert handler.parent is not None
    assert handler.context.trace_id == request.context.trace_id
    assert handler.parent.span_id == request.context.span_id
    assert handler.kind is SpanKind.CONSUMER
    job_id = await eventually(  # the worker records the outcome after the span ends
        lambda: conn.fetchval(
            "SELECT id FROM job_done WHERE arguments->>'reminder_id' = $1", str(reminder["id"])
        ),
        within=30,
        what="the job's recorded success",
    )
    assert handler.attributes == {
        "jobq.job.id": job_id,
        "jobq.job.queue": QUEUE,
        "jobq.job.type": SEND_REMINDER,
        "jobq.job.attempt": 1,
    }

    call = one([s for s in finished if s.kind is SpanKind.CLIENT], "the webhook call")
    assert call.parent is not None
    assert call.context is not None
    assert call.parent.span_id == handler.context.span_id
    assert call.context.trace_id == request.context.trace_id
    assert settings.webhook_secret is not None
    secrets = (user["api_key"], settings.webhook_secret.get_secret_value())
    for span in finished:
        values = " ".join(map(str, (span.attributes or {}).values()))
        assert not any(secret in values for secret in secrets), span.name
    call_values = [str(v) for v in (call.attributes or {}).values()]
    assert f"http://127.0.0.1:{receiver.port}" in call_values  # the URL's origin alone
    assert not any("/hook" in value for value in call_values)

    traceparent = receiver.requests[0].headers["traceparent"]
    assert traceparent.split("-")[1:3] == [
        f"{call.context.trace_id:032x}",
        f"{call.context.span_id:016x}",
    ]


async def test_without_a_tracer_provider_nothing_is_stored_with_the_jobs(
    client: Client, receiver: WebhookReceiver, conn: Connection
) -> None:
    assert not tracing.active()
    user = await create_user(client, webhook_url=receiver.url)
    await create_reminder(client, user["id"], message="hi", remind_in_seconds=0.1)
    await receiver.wait_for(1)
    assert await conn.fetchval("SELECT count(*) FROM job_trace") == 0
