"""The webhook SSRF guard: refused at registration (422 naming the reason) and again at
delivery against the address actually connected to; redirects never followed.

Names are answered by a test resolver (`tests.api.conftest.dns`: `jobq.domain.webhooks.resolve`,
the one function the guard and the HTTP client's network backend both ask, is replaced for the
test; its answer can change between registration and delivery: DNS rebinding). `localhost` is
answered by the machine's own resolver.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

import pytest
from freezegun import freeze_time
from quart.typing import TestClientProtocol as Client

from jobq import jobs
from jobq.config import Settings
from jobq.db import Connection
from jobq.domain import webhooks
from jobq.domain.webhooks import refusal, webhook_client
from jobq.errors import UnsafeWebhook
from jobq.queue import Worker, registry
from tests.api.conftest import Answers, RunJobs
from tests.api.helpers import JSON, assert_error, create_reminder, create_user
from tests.conftest import make_settings
from tests.toolkit.receiver import WebhookReceiver as Receiver

T0 = datetime(2031, 3, 4, 10, 0, tzinfo=UTC)
PUBLIC = "93.184.215.14"
"""A public address (nothing connects to it in these tests)."""


@pytest.fixture
def settings(database_url: str, receiver: Receiver) -> Settings:
    """The guard on, with the receiver's port allowed (its address, 127.0.0.1, is not)."""
    return make_settings(
        database_url, webhook_allow_private=False, webhook_ports={80, 443, receiver.port}
    )


MakeWorker = Callable[..., Awaitable[Worker]]


REFUSED = {
    "http://127.0.0.1/hook": "loopback",
    "http://127.1.2.3/hook": "loopback",
    "http://[::1]/hook": "loopback",
    "http://localhost/hook": "loopback",
    "http://0.0.0.0/hook": "unspecified",
    "http://[::]/hook": "unspecified",
    "http://[::ffff:127.0.0.1]/hook": "loopback",
    "http://[::ffff:10.0.0.1]/hook": "private",
    "http://2130706433/hook": "loopback",
    "http://0177.0.0.1/hook": "loopback",
    "http://0x7f.0.0.1/hook": "loopback",
    "http://10.0.0.5/hook": "private",
    "http://172.16.3.4/hook": "private",
    "http://192.168.1.1/hook": "private",
    "http://100.64.0.1/hook": "special-purpose",
    "http://192.0.0.8/hook": "special-purpose",  # IETF protocol assignments, 192.0.0.0/24
    "http://198.18.0.1/hook": "private",  # benchmarking, 198.18.0.0/15
    "http://192.88.99.1/hook": "special-purpose",  # the 6to4 relay anycast
    "http://[2002:7f00:1::]/hook": "IPv6 form of a loopback",  # 6to4 of 127.0.0.1
    "http://[2002:a00:1::]/hook": "IPv6 form of a private",  # 6to4 of 10.0.0.1
    "http://[64:ff9b::7f00:1]/hook": "IPv6 form of a loopback",  # NAT64 of 127.0.0.1
    "http://[64:ff9b::a9fe:a9fe]/hook": "IPv6 form of a link-local",  # NAT64, 169.254.169.254
    "http://[64:ff9b:1::a00:1]/hook": "IPv6 form of a private",  # local-use NAT64 of 10.0.0.1
    "http://[::ffff:0:7f00:1]/hook": "IPv6 form of a loopback",  # IPv4-translated
    "http://[::7f00:1]/hook": "IPv6 form of a loopback",  # IPv4-compatible
    # Teredo: server 65.54.227.120, client 192.0.2.45 (obfuscated in the last 32 bits)
    "http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/hook": "IPv6 form of a private",
    "http://[2001:db8::1]/hook": "private",
    "http://[3fff::1]/hook": "special-purpose",  # documentation, 3fff::/20
    "http://[fc00::1]/hook": "private",
    "http://169.254.169.254/latest/meta-data/": "link-local",
    "http://[fe80::1]/hook": "link-local",
    "http://224.0.0.1/hook": "multicast",
    "http://[ff02::1]/hook": "multicast",
    "http://240.0.0.1/hook": "reserved",
    "http://internal.test/hook": "private",  # the test resolver: 10.1.2.3
    "http://mixed.test/hook": "loopback",  # one public and one loopback address
    f"http://{PUBLIC}:5432/hook": "port 5432 is not allowed",
    f"http://{PUBLIC}:22/hook": "port 22 is not allowed",
}


@pytest.mark.parametrize(("url", "reason"), list(REFUSED.items()))
async def test_refused_at_registration_with_the_reason(
    client: Client, conn: Connection, dns: Answers, url: str, reason: str
) -> None:
    dns["internal.test"] = ["10.1.2.3"]
    dns["mixed.test"] = [PUBLIC, "127.0.0.1"]
    response = await client.post(
        "/users", json={"name": "Ann", "email": "ann@example.com", "webhook_url": url}
    )
    assert response.status_code == 422
    body = await response.get_json()
    assert_error(body, "validation_error")
    [error] = body["detail"]
    assert error["loc"] == ["webhook_url"]
    assert error["type"] == "unsafe_webhook"
    assert reason in error["msg"]
    for address in (urlsplit(url).hostname, "127.0.0.1", "10.1.2.3"):
        assert address not in error["msg"]  # the answer names no address
    assert await conn.fetchval("SELECT count(*) FROM users") == 0
    assert await conn.fetchval("SELECT count(*) FROM api_keys") == 0


async def test_a_name_that_does_not_resolve_is_refused(client: Client, dns: Answers) -> None:
    response = await client.post(
        "/users",
        json={"name": "A", "email": "a@example.com", "webhook_url": "http://nowhere.invalid/"},
    )
    assert response.status_code == 422
    assert "does not resolve" in (await response.get_json())["detail"][0]["msg"]


@pytest.mark.parametrize(
    "url",
    [
        f"http://{PUBLIC}/hook",
        "https://hooks.example.test/hook",
        f"http://{PUBLIC}:443/",
        "http://[2002:5db8:d70e::1]/hook",  # 6to4 of PUBLIC
        "http://[64:ff9b::5db8:d70e]/hook",  # NAT64 of PUBLIC
    ],
)
async def test_public_addresses_on_allowed_ports_are_accepted(
    client: Client, dns: Answers, url: str
) -> None:
    dns["hooks.example.test"] = [PUBLIC, "2606:2800:21f:cb07:6820:80da:af6b:8b2c"]
    user = await create_user(client, webhook_url=url)
    assert user["webhook_url"] == url


@pytest.mark.parametrize(
    ("address", "port", "reason"),
    [
        ("127.0.0.1", 80, "its host resolves to a loopback address"),
        ("::ffff:7f00:1", 80, "its host resolves to an IPv6 form of a loopback address"),
        ("2002:7f00:1::", 80, "its host resolves to an IPv6 form of a loopback address"),
        ("192.0.0.8", 80, "its host resolves to a special-purpose address"),
        ("192.0.0.9", 80, "special-purpose"),
        ("2001:4:112::1", 80, "private"),
        ("2002:5db8:d70e::", 80, None),  # 6to4 of a public address
        ("::ffff:169.254.169.254", 80, "link-local"),
        ("fec0::1", 80, "site-local"),
        ("fe80::1%eth0", 80, "link-local"),
        ("8.8.8.8", 25, "port 25 is not allowed (allowed: 80, 443, 8080, 8443)"),
        ("8.8.8.8", 443, None),
        ("2001:4860:4860::8888", 80, None),
    ],
)
def test_refusal(database_url: str, address: str, port: int, reason: str | None) -> None:
    guarded = make_settings(database_url, webhook_allow_private=False)
    found = refusal(address, port, guarded)
    if reason is None:
        assert found is None
    else:
        assert found is not None
        assert reason in found
    assert refusal(address, port, make_settings(database_url)) is None  # allowed in development


def test_webhook_ports_from_the_environment(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JOBQ_WEBHOOK_PORTS", "443, 9000")
    assert Settings(_env_file=None, database_url=database_url).webhook_ports == {443, 9000}


async def schedule_due(client: Client, url: str) -> JSON:
    """A user with webhook `url` and a reminder due at T0 + 60 s."""
    with freeze_time(T0, real_asyncio=True):
        user = await create_user(client, webhook_url=url)
        return await create_reminder(client, user["id"], message="hi", remind_in_seconds=60)


async def reminder_after(client: Client, reminder: JSON) -> JSON:
    body: JSON = await (await client.get(f"/reminders/{reminder['id']}")).get_json()
    return body


async def test_a_name_rebound_to_loopback_at_delivery_is_refused(
    client: Client, dns: Answers, run_jobs: RunJobs, receiver: Receiver
) -> None:
    """Public when registered, 127.0.0.1 (where the receiver listens) when delivered: the
    guard checks the address it would connect to, and never connects."""
    dns["rebind.test"] = [PUBLIC]
    reminder = await schedule_due(client, f"http://rebind.test:{receiver.port}/hook")
    dns["rebind.test"] = ["127.0.0.1"]
    assert await run_jobs(at=T0 + timedelta(seconds=61)) == 1
    assert receiver.requests == []
    after = await reminder_after(client, reminder)
    assert after["status"] == "scheduled"
    assert after["attempts"] == 1
    assert after["last_error"] == (
        "WebhookFailed: webhook at rebind.test refused: its host resolves to a loopback address"
    )


async def test_a_stored_private_address_is_refused_at_delivery(
    client: Client, conn: Connection, run_jobs: RunJobs, receiver: Receiver
) -> None:
    """A URL stored before the guard (or under `webhook_allow_private`) is checked again at
    delivery, IP literal or not."""
    reminder = await schedule_due(client, f"http://{PUBLIC}/hook")
    await conn.execute("UPDATE users SET webhook_url = $1", receiver.url)
    assert await run_jobs(at=T0 + timedelta(seconds=61)) == 1
    assert receiver.requests == []
    after = await reminder_after(client, reminder)
    assert "refused: its host resolves to a loopback address" in after["last_error"]


@contextlib.asynccontextmanager
async def redirector(location: str) -> AsyncIterator[int]:
    """A server on 127.0.0.1 answering every request `302 Found` to `location`; yields its
    port."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (
                    int(v)
                    for k, _, v in (ln.partition(":") for ln in head.decode().split("\r\n"))
                    if k.lower() == "content-length"
                ),
                0,
            )
            await reader.readexactly(length)
            writer.write(
                f"HTTP/1.1 302 Found\r\nLocation: {location}\r\n"
                "Content-Length: 0\r\nConnection: close\r\n\r\n".encode()
            )
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def deliver_in_development(make_worker: MakeWorker, database_url: str, at: datetime) -> None:
    """Run the due jobs once with the guard off (`webhook_allow_private`, the development
    setting) but the same guarded client: its resolver, no redirects."""
    dev = make_settings(database_url)
    async with webhook_client(dev) as http:
        worker = await make_worker(registry, state={"settings": dev, "http": http})
        with freeze_time(at, real_asyncio=True):
            assert await worker.run_once() == 1
            await worker.wait_idle()


async def test_a_redirect_to_a_private_address_is_not_followed(
    client: Client,
    conn: Connection,
    make_worker: MakeWorker,
    receiver: Receiver,
    database_url: str,
) -> None:
    """The webhook answers 302 to the receiver on 127.0.0.1: the attempt fails with the 302,
    and nothing reaches the receiver."""
    reminder = await schedule_due(client, f"http://{PUBLIC}/hook")
    async with redirector(receiver.url) as port:
        await conn.execute("UPDATE users SET webhook_url = $1", f"http://127.0.0.1:{port}/hook")
        await deliver_in_development(make_worker, database_url, T0 + timedelta(seconds=61))
    assert receiver.requests == []
    after = await reminder_after(client, reminder)
    assert after["status"] == "scheduled"
    assert after["last_error"] == "WebhookFailed: webhook at 127.0.0.1 answered HTTP 302"


async def test_the_client_connects_to_the_address_it_resolved(
    client: Client,
    conn: Connection,
    dns: Answers,
    make_worker: MakeWorker,
    receiver: Receiver,
    database_url: str,
) -> None:
    """The guarded client's own resolver decides where it connects; the request still names
    the host (`Host`), as TLS would."""
    dns["hooks.test"] = ["127.0.0.1"]
    reminder = await schedule_due(client, f"http://{PUBLIC}/hook")
    url = f"http://hooks.test:{receiver.port}/hook"
    await conn.execute("UPDATE users SET webhook_url = $1", url)
    await deliver_in_development(make_worker, database_url, T0 + timedelta(seconds=61))
    [request] = receiver.requests
    assert request.headers["host"] == f"hooks.test:{receiver.port}"
    assert (await reminder_after(client, reminder))["status"] == "sent"


async def test_turning_the_guard_on_stops_the_pending_retries_to_internal_targets(
    client: Client,
    conn: Connection,
    make_worker: MakeWorker,
    receiver: Receiver,
    database_url: str,
    settings: Settings,
) -> None:
    """A delivery to 127.0.0.1 fails while the guard is off (development) and waits for its
    retry; the service restarts with the guard on: the retry is refused before any byte is
    sent, since the guard checks every attempt, not the registration alone."""
    reminder = await schedule_due(client, f"http://{PUBLIC}/hook")
    await conn.execute("UPDATE users SET webhook_url = $1", receiver.url)
    receiver.status = 500
    await deliver_in_development(make_worker, database_url, T0 + timedelta(seconds=61))
    assert len(receiver.requests) == 1  # the guard was off
    receiver.status = 200
    ripe_at = await conn.fetchval("SELECT ripe_at FROM job WHERE id = $1", reminder["job_id"])
    async with webhook_client(settings) as http:
        worker = await make_worker(registry, state={"settings": settings, "http": http})
        with freeze_time(ripe_at, real_asyncio=True):
            assert await worker.run_once() == 1
            await worker.wait_idle()
    assert len(receiver.requests) == 1
    after = await reminder_after(client, reminder)
    assert after["attempts"] == 2
    assert after["last_error"] == (
        "WebhookFailed: webhook at 127.0.0.1 refused: its host resolves to a loopback address"
    )


@pytest.mark.parametrize("allow_private", [True, False])
async def test_a_warning_at_every_start_while_the_guard_is_off(
    database_url: str, caplog: pytest.LogCaptureFixture, allow_private: bool
) -> None:
    """Every worker start (`jobq.jobs.job_state`: `python -m jobq worker`, `serve` with its
    worker, `make run`'s workers) says so while the guard is off; none while it is on."""
    started = make_settings(database_url, webhook_allow_private=allow_private)
    for _ in range(2):
        caplog.clear()
        async with jobs.job_state(started):
            pass
        warned = [
            r
            for r in caplog.records
            if r.levelname == "WARNING" and "SSRF guard is off" in r.message
        ]
        assert len(warned) == (1 if allow_private else 0)


async def test_a_lookup_that_hangs_is_bounded(
    client: Client, dns: Answers, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DNS lookup that never answers fails the registration's check within
    `webhook_connect_timeout` (422), and a delivery's the same way."""
    quick = make_settings(
        database_url, webhook_allow_private=False, webhook_connect_timeout=timedelta(seconds=0.3)
    )

    async def never(host: str, port: int) -> list[str]:
        await asyncio.Event().wait()
        return []

    monkeypatch.setattr(webhooks, "resolve", never)
    with pytest.raises(UnsafeWebhook, match=r"its host did not resolve within 0.3 s"):
        await asyncio.wait_for(webhooks.check_url("http://slow-dns.test/", quick), 5)
    with pytest.raises(UnsafeWebhook, match=r"did not resolve"):
        await asyncio.wait_for(webhooks.resolve_target("http://slow-dns.test/", quick), 5)


async def test_the_client_tries_each_checked_address_in_turn(
    client: Client,
    conn: Connection,
    dns: Answers,
    make_worker: MakeWorker,
    receiver: Receiver,
    database_url: str,
) -> None:
    """A name with two addresses, the first refusing connections: the delivery reaches the
    second, one of the addresses the attempt resolved and checked."""
    dns["two.test"] = ["127.0.0.2", "127.0.0.1"]  # the receiver listens on 127.0.0.1 alone
    reminder = await schedule_due(client, f"http://{PUBLIC}/hook")
    await conn.execute("UPDATE users SET webhook_url = $1", f"http://two.test:{receiver.port}/")
    await deliver_in_development(make_worker, database_url, T0 + timedelta(seconds=61))
    assert len(receiver.requests) == 1
    assert (await reminder_after(client, reminder))["status"] == "sent"
