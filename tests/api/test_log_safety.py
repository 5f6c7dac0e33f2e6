"""Logs that cannot leak or lie (`jobq.logs`): a delivery to a webhook whose URL holds
credentials and a token leaves neither in any line, httpx's included; a forged newline (in a URL
path, in a reminder's message) stays inside one escaped text line, the access log's too; the
JSON format is as it was."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Literal

import httpx
import pytest
from quart.typing import TestClientProtocol as Client

from jobq import db, logs
from jobq.app import create_app
from jobq.config import Settings
from jobq.db import Connection, Database
from jobq.logs import escape, redact_urls
from tests.api.conftest import ADMIN_TOKEN, RunJobs
from tests.api.helpers import create_reminder, create_user
from tests.conftest import make_settings
from tests.toolkit.receiver import WebhookReceiver
from tests.toolkit.served import served

FORGED = "\n2026-11-27 12:00:00,000 INFO jobq.audit: audit actor=admin action=queue.pause"


@pytest.fixture(params=["text", "json"])
def log_lines(request: pytest.FixtureRequest) -> Iterator[tuple[str, io.StringIO]]:
    """Every record at DEBUG and above, through the handler `jobq.logs.configure` installs
    (text or JSON), into a buffer: (format, buffer)."""
    log_format: Literal["text", "json"] = request.param
    out = io.StringIO()
    handler = logs.stream_handler(log_format, out)
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield log_format, out
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


@pytest.mark.parametrize(
    ("text", "redacted"),
    [
        (
            'HTTP Request: POST http://user:pass@127.0.0.1:9000/hook?token=t "HTTP/1.1 200 OK"',
            'HTTP Request: POST http://127.0.0.1:9000 "HTTP/1.1 200 OK"',
        ),
        ("https://hooks.example.com/a/b#frag and more", "https://hooks.example.com and more"),
        ("to http://[::1]:8080/x?y=1.", "to http://[::1]:8080"),
        ("at http://u:p@host", "at http://host"),
        ("at http://u:p/w@host/x", "at http://..."),  # a password with a slash: no host
        ("no url here: a://", "no url here: a://"),
    ],
)
def test_a_url_is_cut_to_its_origin(text: str, redacted: str) -> None:
    assert redact_urls(text) == redacted


def test_control_characters_are_escaped() -> None:
    assert escape("a\nb\rc\td\x1b[31m\x00\x7f\x85\u2028é") == (
        "a\\nb\\rc\\td\\x1b[31m\\x00\\x7f\\x85\\u2028é"
    )


async def test_a_delivery_logs_no_credentials_path_or_query(
    client: Client,
    run_jobs: RunJobs,
    receiver: WebhookReceiver,
    log_lines: tuple[str, io.StringIO],
    caplog: pytest.LogCaptureFixture,
    conn: Connection,
) -> None:
    _, out = log_lines
    url = receiver.url.replace("http://", "http://ann:hunter2pass@") + "?token=s3cr3t-t0ken"
    user = await create_user(client, webhook_url=url)
    await create_reminder(client, user["id"], message="hi", remind_in_seconds=60)
    later = datetime.now(UTC) + timedelta(minutes=5)  # the workers run past its due time
    receiver.status = 500  # a failed attempt logs too
    with caplog.at_level(logging.DEBUG):
        assert await run_jobs(at=later) == 1
        receiver.status = 200
        await conn.execute("UPDATE job SET ripe_at = $1", later)  # the retry, at once
        assert await run_jobs(at=later) == 1
    assert [r.path for r in receiver.requests] == ["/hook?token=s3cr3t-t0ken"] * 2
    written = out.getvalue()
    origin = receiver.url.removesuffix("/hook")
    host = origin.removeprefix("http://").split(":")[0]
    assert f"webhook at {host} answered HTTP 500" in written  # the failed attempt, logged
    for text in (written, caplog.text):  # pytest's handler sees the records cut too
        for secret in ("hunter2pass", "ann:", "token=", "s3cr3t", "/hook"):
            assert secret not in text


async def test_a_forged_newline_in_a_message_stays_one_escaped_line(
    client: Client, run_jobs: RunJobs, log_lines: tuple[str, io.StringIO]
) -> None:
    log_format, out = log_lines
    user = await create_user(client)  # no webhook: the reminder is delivered to the log
    message = f"hi{FORGED}"
    await create_reminder(client, user["id"], message=message, remind_in_seconds=60)
    later = datetime.now(UTC) + timedelta(minutes=5)  # the worker runs past its due time
    assert await run_jobs(at=later) == 1
    lines = out.getvalue().splitlines()
    delivered = [line for line in lines if "reminder 1 for user" in line]
    assert len(delivered) == 1
    assert not any(line.startswith("2026-11-27 12:00:00,000") for line in lines)
    if log_format == "text":
        assert delivered[0].endswith(f"hi{escape(FORGED)}")
    else:
        assert json.loads(delivered[0])["message"] == f"reminder 1 for user 1: {message}"


async def test_the_access_log_escapes_a_forged_path(
    pool_url: str, database: Database, log_lines: tuple[str, io.StringIO]
) -> None:
    log_format, out = log_lines
    settings: Settings = make_settings(pool_url, admin_token=ADMIN_TOKEN)
    try:
        async with (
            served(create_app(settings), access_log=True) as url,
            httpx.AsyncClient(base_url=url) as http,
        ):
            path = "/queues/x%0a2026-11-27%2012:00:00,000%20INFO%20jobq.audit:%20actor=admin/pause"
            response = await http.post(path)
            assert response.status_code == 404
    finally:
        db.bind(database)
    lines = out.getvalue().splitlines()
    access = [line for line in lines if "/queues/x" in line]
    assert len(access) == 1, lines
    assert not any("jobq.audit" in line and "/queues/x" not in line for line in lines)
    if log_format == "text":
        assert "/queues/x\\n2026-11-27 12:00:00,000 INFO jobq.audit" in access[0]
    else:
        assert "/queues/x\n2026" in json.loads(access[0])["message"]
