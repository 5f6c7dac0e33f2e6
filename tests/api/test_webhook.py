"""Delivery of due reminders by a worker running the app's `send_reminder` handler, to a real
HTTP receiver on 127.0.0.1: signed JSON, retries with backoff, the dead letter, exactly one
`sent` mark."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import re
import socket
from datetime import UTC, datetime, timedelta, timezone

import aiohttp
import pytest
from freezegun import freeze_time
from quart.typing import TestClientProtocol as Client
from standardwebhooks import Webhook, WebhookVerificationError

from jobq.config import Settings
from jobq.db import Connection
from jobq.domain.webhooks import webhook_client
from jobq.jobs.reminders import describe_failure, utc_z
from jobq.queue import Job, enqueue
from jobq.queue.model import DEFAULT_MAX_RETRIES
from tests.api.conftest import Answers, RunJobs
from tests.api.helpers import JSON, create_reminder, create_user
from tests.toolkit.receiver import WebhookReceiver, assert_reminder_delivery

T0 = datetime(2031, 3, 4, 10, 0, tzinfo=UTC)
DUE = T0 + timedelta(seconds=60)


async def schedule(client: Client, webhook_url: str | None, message: str = "Call Bob") -> JSON:
    """A user (with `webhook_url`) and a reminder due at `DUE`, created at `T0`."""
    extra = {} if webhook_url is None else {"webhook_url": webhook_url}
    with freeze_time(T0, real_asyncio=True):
        user = await create_user(client, **extra)
        return await create_reminder(client, user["id"], message=message, remind_in_seconds=60)


async def get_reminder(client: Client, reminder_id: int) -> JSON:
    response = await client.get(f"/reminders/{reminder_id}")
    assert response.status_code == 200
    body: JSON = await response.get_json()
    return body


async def test_due_reminder_is_posted_signed_and_marked_sent(
    client: Client,
    conn: Connection,
    run_jobs: RunJobs,
    receiver: WebhookReceiver,
    settings: Settings,
) -> None:
    reminder = await schedule(client, receiver.url, message="Call Bob — ☎ «now»")

    # not due yet: nothing is claimed, nothing is sent
    assert await run_jobs(at=DUE - timedelta(seconds=1)) == 0
    assert receiver.requests == []

    assert await run_jobs(at=DUE + timedelta(seconds=5)) == 1
    assert len(receiver.requests) == 1
    assert settings.webhook_secret is not None
    assert_reminder_delivery(
        receiver.requests[0],
        secret=settings.webhook_secret.get_secret_value(),
        reminder_id=reminder["id"],
        user_id=reminder["user_id"],
        message="Call Bob — ☎ «now»",
        remind_at=DUE,
    )

    sent = await get_reminder(client, reminder["id"])
    assert sent["status"] == "sent"
    assert datetime.fromisoformat(sent["sent_at"]) == DUE + timedelta(seconds=5)
    assert sent["attempts"] == 1
    assert sent["deliveries"] == 1  # a one-off reminder's one delivery
    assert sent["last_error"] is None
    for table in ("job", "job_running", "job_dead"):
        assert await conn.fetchval(f"SELECT count(*) FROM {table}") == 0


async def test_the_standard_webhooks_verifier_accepts_a_delivery_and_refuses_its_replay(
    client: Client, run_jobs: RunJobs, receiver: WebhookReceiver, settings: Settings
) -> None:
    """The `standardwebhooks` package's own verifier, as a receiver runs it: the delivery
    verifies at its arrival; a changed body, another secret, or the same delivery replayed
    past the verifier's tolerance (5 minutes) is refused."""
    reminder = await schedule(client, receiver.url)
    await run_jobs(at=DUE)
    (request,) = receiver.requests
    assert settings.webhook_secret is not None
    secret = settings.webhook_secret.get_secret_value()
    headers = {k: v for k, v in request.headers.items() if k.startswith("webhook-")}
    assert headers["webhook-id"] == f"msg_reminder_{reminder['id']}"
    assert headers["webhook-timestamp"] == str(int(DUE.timestamp()))
    with freeze_time(DUE + timedelta(seconds=2)):
        assert Webhook(secret).verify(request.body, headers)["reminder_id"] == reminder["id"]
        with pytest.raises(WebhookVerificationError):
            Webhook(secret).verify(request.body + b" ", headers)
        other = "whsec_" + base64.b64encode(b"another-secret-of-thirty-two-byt").decode()
        with pytest.raises(WebhookVerificationError):
            Webhook(other).verify(request.body, headers)
    with freeze_time(DUE + timedelta(minutes=6)), pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(request.body, headers)  # a replay, later


async def test_a_delivery_keeps_its_id_across_retries(
    client: Client, conn: Connection, run_jobs: RunJobs, receiver: WebhookReceiver
) -> None:
    """Each attempt is signed at its own time, with the delivery's one id: a receiver that
    took an attempt whose answer was lost drops the retry by its `webhook-id`."""
    receiver.status = 500
    reminder = await schedule(client, receiver.url)
    await run_jobs(at=DUE)
    receiver.status = 204
    ripe_at = await conn.fetchval("SELECT ripe_at FROM job WHERE id = $1", reminder["job_id"])
    await run_jobs(at=ripe_at)
    first, second = receiver.requests
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    assert int(second.headers["webhook-timestamp"]) == int(ripe_at.timestamp())
    assert "x-jobq-signature" not in second.headers


async def test_failed_delivery_is_retried_with_backoff_then_fails(
    client: Client, conn: Connection, run_jobs: RunJobs, receiver: WebhookReceiver
) -> None:
    receiver.status = 500
    reminder = await schedule(client, receiver.url)

    at = DUE
    assert await run_jobs(at=at) == 1
    assert len(receiver.requests) == 1
    failed = await get_reminder(client, reminder["id"])
    assert failed["status"] == "scheduled"
    assert failed["attempts"] == 1
    assert failed["sent_at"] is None
    assert "500" in failed["last_error"]
    job = await conn.fetchrow("SELECT * FROM job WHERE id = $1", reminder["job_id"])
    assert job is not None
    assert job["attempts"] == 1
    assert job["ripe_at"] > at
    assert job["arguments"] == {"reminder_id": reminder["id"]}

    # not ripe again before its backoff is over
    assert await run_jobs(at=at) == 0
    for attempt in range(2, DEFAULT_MAX_RETRIES + 2):
        ripe_at = await conn.fetchval("SELECT ripe_at FROM job WHERE id = $1", reminder["job_id"])
        assert ripe_at > at
        at = ripe_at
        assert await run_jobs(at=at) == 1
        assert len(receiver.requests) == attempt
        assert json.loads(receiver.requests[-1].body)["attempt"] == attempt

    dead = await get_reminder(client, reminder["id"])
    assert dead["status"] == "failed"
    assert dead["attempts"] == DEFAULT_MAX_RETRIES + 1
    assert dead["sent_at"] is None
    assert "500" in dead["last_error"]
    assert await conn.fetchval("SELECT count(*) FROM job") == 0
    row = await conn.fetchrow("SELECT * FROM job_dead WHERE id = $1", reminder["job_id"])
    assert row is not None
    assert row["attempts"] == DEFAULT_MAX_RETRIES + 1
    # the dead letter is not retried
    assert await run_jobs(at=at + timedelta(days=1)) == 0
    assert len(receiver.requests) == DEFAULT_MAX_RETRIES + 1


async def test_failed_delivery_then_success(
    client: Client, run_jobs: RunJobs, receiver: WebhookReceiver, conn: Connection
) -> None:
    receiver.status = 503
    reminder = await schedule(client, receiver.url)
    await run_jobs(at=DUE)
    receiver.status = 204
    ripe_at = await conn.fetchval("SELECT ripe_at FROM job WHERE id = $1", reminder["job_id"])
    assert await run_jobs(at=ripe_at) == 1
    sent = await get_reminder(client, reminder["id"])
    assert sent["status"] == "sent"
    assert sent["attempts"] == 2
    assert datetime.fromisoformat(sent["sent_at"]) == ripe_at
    assert [json.loads(r.body)["attempt"] for r in receiver.requests] == [1, 2]


async def test_unreachable_webhook_is_a_failed_attempt(
    client: Client, run_jobs: RunJobs, receiver: WebhookReceiver
) -> None:
    # a port that is bound but not listening: the connection is refused
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        reminder = await schedule(client, f"http://127.0.0.1:{port}/hook")
        assert await run_jobs(at=DUE) == 1
    failed = await get_reminder(client, reminder["id"])
    assert failed["status"] == "scheduled"
    assert failed["attempts"] == 1
    assert failed["last_error"]
    assert receiver.requests == []


async def test_job_that_runs_twice_marks_sent_once(
    client: Client, conn: Connection, run_jobs: RunJobs, receiver: WebhookReceiver
) -> None:
    reminder = await schedule(client, receiver.url)
    assert await run_jobs(at=DUE) == 1
    first = await get_reminder(client, reminder["id"])
    assert first["status"] == "sent"

    # the same job once more (a re-run after a lost acknowledgement looks like this)
    again = await enqueue(Job(job_type="send_reminder", arguments={"reminder_id": reminder["id"]}))
    assert not again.duplicate
    assert await run_jobs(at=DUE + timedelta(hours=1)) == 1
    assert len(receiver.requests) == 1  # not delivered twice
    second = await get_reminder(client, reminder["id"])
    assert second["sent_at"] == first["sent_at"]
    assert second["attempts"] == 1
    assert second["status"] == "sent"
    assert await conn.fetchval("SELECT count(*) FROM job") == 0


async def test_reminder_without_webhook_is_logged_and_sent(
    client: Client, run_jobs: RunJobs, receiver: WebhookReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="jobq.jobs.reminders")
    reminder = await schedule(client, None, message="Feed the cat")
    assert await run_jobs(at=DUE) == 1
    sent = await get_reminder(client, reminder["id"])
    assert sent["status"] == "sent"
    assert sent["attempts"] == 1
    assert datetime.fromisoformat(sent["sent_at"]) == DUE
    logged = [r.getMessage() for r in caplog.records if r.name == "jobq.jobs.reminders"]
    assert any("Feed the cat" in m and str(reminder["id"]) in m for m in logged), logged
    assert receiver.requests == []


async def test_deleted_reminder_is_not_delivered(
    client: Client, conn: Connection, run_jobs: RunJobs, receiver: WebhookReceiver
) -> None:
    reminder = await schedule(client, receiver.url)
    assert (await client.delete(f"/reminders/{reminder['id']}")).status_code == 204
    assert await run_jobs(at=DUE) == 0
    assert receiver.requests == []


async def test_delete_failed_reminder_removes_its_dead_job(
    client: Client, conn: Connection, run_jobs: RunJobs, receiver: WebhookReceiver
) -> None:
    receiver.status = 500
    reminder = await schedule(client, receiver.url)
    await conn.execute("UPDATE job SET max_retries = 0 WHERE id = $1", reminder["job_id"])
    await run_jobs(at=DUE)
    assert (await get_reminder(client, reminder["id"]))["status"] == "failed"
    assert await conn.fetchval("SELECT count(*) FROM job_dead") == 1
    response = await client.delete(f"/reminders/{reminder['id']}")
    assert response.status_code == 204
    assert await conn.fetchval("SELECT count(*) FROM job_dead") == 0
    assert await conn.fetchval("SELECT count(*) FROM reminders") == 0


def test_a_failed_call_says_what_failed_without_the_url_path() -> None:
    """`ClientOSError` alone says little: the log and `last_error` name the host and the cause,
    never the path, query or credentials of the URL, nor the address connected to."""
    url = "https://user:pw@hooks.example.com/secret-path?token=abc"
    reset = aiohttp.ClientOSError(104, "Connection reset by peer")
    described = describe_failure(url, reset)
    assert described == "ClientOSError from hooks.example.com: Connection reset by peer"
    refused = ConnectionRefusedError(111, "Connect call failed ('10.1.2.3', 443)")
    try:
        try:
            raise refused
        except OSError as cause:
            raise aiohttp.ClientOSError(*cause.args) from cause
    except aiohttp.ClientOSError as exc:
        described = describe_failure(url, exc)
    assert described == "ClientOSError from hooks.example.com: Connection refused"
    timeout = aiohttp.SocketTimeoutError("Timeout on reading data from socket")
    assert describe_failure(url, timeout) == "SocketTimeoutError from hooks.example.com: timed out"
    invalid = describe_failure(url, aiohttp.InvalidURL(url))
    for secret in ("pw", "secret-path", "token=abc", "10.1.2.3"):
        assert secret not in described
        assert secret not in invalid


def test_webhook_times_are_utc_with_z() -> None:
    moment = datetime(2031, 3, 4, 11, 0, tzinfo=timezone(timedelta(hours=1)))
    assert utc_z(moment) == "2031-03-04T10:00:00Z"


async def test_the_webhook_client_sends_as_many_calls_at_once_as_a_worker_has_slots(
    settings: Settings,
) -> None:
    """A worker's slots (16 by default) all deliver at once: a server on 127.0.0.1 answers no
    call until all of them are in (or half the read timeout has passed), and sees them all in
    flight together. A pool that capped its connections (aiohttp's default: 100, per host: none;
    httpcore's: 10) would hold deliveries to healthy hosts behind those waiting on slow ones."""
    calls = settings.max_concurrent_jobs
    hold_s = settings.webhook_timeout.total_seconds() / 2
    in_flight, peak = 0, 0
    all_in = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal in_flight, peak
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
                await reader.readexactly(int(length.group(1)) if length else 0)
                in_flight += 1
                peak = max(peak, in_flight)
                if in_flight == calls:
                    all_in.set()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(all_in.wait(), hold_s)
                in_flight -= 1
                writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/hook"
    try:
        async with webhook_client(settings) as http:

            async def post() -> int:
                async with http.post(url, data=b"{}") as answer:
                    return answer.status

            answers = await asyncio.gather(*(post() for _ in range(calls)))
    finally:
        server.close()
        await server.wait_closed()
    assert answers == [204] * calls
    assert peak == calls


async def test_a_webhook_cannot_set_cookies_for_the_next_delivery(
    client: Client, run_jobs: RunJobs, dns: Answers
) -> None:
    """A webhook that answers with `Set-Cookie` gets no `Cookie` back, nor does another user's
    webhook on the same host: the client keeps no cookies."""
    cookies: list[str | None] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
                await reader.readexactly(int(length.group(1)) if length else 0)
                cookie = re.search(rb"(?i)\r\ncookie: *([^\r]*)", head)
                cookies.append(cookie.group(1).decode() if cookie else None)
                writer.write(
                    b"HTTP/1.1 204 No Content\r\nSet-Cookie: session=ann-secret; Path=/\r\n\r\n"
                )
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    dns["hooks.example.com"] = ["127.0.0.1"]  # a name: a cookie jar keeps no cookie of an IP
    url = f"http://hooks.example.com:{server.sockets[0].getsockname()[1]}/hook"
    try:
        with freeze_time(T0, real_asyncio=True):
            for who in ("ann", "bob"):
                user = await create_user(client, who, f"{who}@example.com", webhook_url=url)
                for _ in range(2):
                    await create_reminder(client, user["id"], message="m", remind_in_seconds=60)
        assert await run_jobs(at=DUE) == 4
    finally:
        server.close()
        await server.wait_closed()
    assert cookies == [None] * 4
