"""Security: who may call the admin endpoints; secrets never in logs, error bodies or reprs;
parameterized SQL; webhooks bounded in time and in what they make the worker read."""

from __future__ import annotations

import ast
import asyncio
import base64
import contextlib
import logging
import os
import re
import socket
import subprocess
import sys
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from freezegun import freeze_time
from pydantic import ValidationError
from quart.testing.app import LifespanError
from quart.typing import TestClientProtocol as Client
from werkzeug.exceptions import NotFound

from jobq import db
from jobq.api.admin import Refused, authorize
from jobq.app import create_app
from jobq.config import PROJECT_ROOT, Settings
from jobq.db import Connection, Database
from jobq.domain.webhooks import webhook_client
from jobq.queue import Worker, registry
from tests.api.conftest import ADMIN, ADMIN_TOKEN, DatabaseProxy
from tests.api.helpers import JSON, assert_error, create_reminder, create_user
from tests.conftest import make_settings
from tests.toolkit.procs import free_port
from tests.toolkit.receiver import WebhookReceiver

WEBHOOK_SECRET = "whsec_bmV2ZXItbG9nZ2VkLTNiOGYxYzdhLXdlYmhvb2sta2U="  # noqa: S105 (a test value)
DB_PASSWORD = "pw-9e4d2a61-never-logged"  # noqa: S105 (a test value)
WELL_FORMED_KEY = "jq_1_" + "k" * 43
"""An API key of the right form: checking it needs the database."""

ADMIN_CALLS = [
    ("GET", "/jobs/dead"),
    ("POST", "/jobs/dead/1/retry"),
    ("DELETE", "/jobs/dead/1"),
    ("GET", "/workers"),
    ("GET", "/queues"),
    ("POST", "/queues/default/pause"),
    ("POST", "/queues/default/resume"),
    ("GET", "/workflows"),
]

MakeWorker = Callable[..., Awaitable[Worker]]


@pytest.fixture
def settings(database_url: str) -> Settings:
    """The test settings, with an admin token and a recognisable webhook secret."""
    return make_settings(database_url, admin_token=ADMIN_TOKEN, webhook_secret=WEBHOOK_SECRET)


async def bury_one(conn: Connection) -> None:
    """Dead job 1, which a refused retry or discard must leave alone."""
    now = datetime.now(UTC)
    await conn.execute(
        "INSERT INTO job_dead (id, job_type, arguments, priority, attempts, max_retries,"
        " last_error, created_at, died_at) VALUES (1, 't', '{}', 0, 1, 0, 'boom', $1, $1)",
        now,
    )


async def call(client: Client, method: str, path: str, headers: dict[str, str]) -> Any:
    verbs = {"GET": client.get, "POST": client.post, "DELETE": client.delete}
    return await verbs[method](path, headers=headers)


# -- who may call the admin endpoints ------------------------------------------------------------

BAD_AUTHORIZATIONS = {
    "no header": None,
    "empty": "",
    "scheme only": "Bearer",
    "scheme and space": "Bearer ",
    "wrong token": "Bearer not-the-admin-token-at-all",
    "token plus a character": f"Bearer {ADMIN_TOKEN}x",
    "token minus a character": f"Bearer {ADMIN_TOKEN[:-1]}",
    "token in upper case": f"Bearer {ADMIN_TOKEN.upper()}",
    "token and more": f"Bearer {ADMIN_TOKEN} {ADMIN_TOKEN}",
    "no scheme": ADMIN_TOKEN,
    "basic": "Basic " + base64.b64encode(f"admin:{ADMIN_TOKEN}".encode()).decode(),
    "token scheme": f"Token {ADMIN_TOKEN}",
    "not ascii": "Bearer t\xf6ken",
}


@pytest.mark.parametrize(("method", "path"), ADMIN_CALLS)
async def test_missing_or_wrong_token_is_401_and_writes_nothing(
    client: Client, conn: Connection, method: str, path: str
) -> None:
    await bury_one(conn)
    for case, authorization in BAD_AUTHORIZATIONS.items():
        headers = {} if authorization is None else {"Authorization": authorization}
        response = await call(client, method, path, headers)
        assert response.status_code == 401, case
        assert response.content_type == "application/json", case
        assert_error(await response.get_json(), "unauthorized")
        challenge = response.headers["WWW-Authenticate"]
        assert challenge.lower().startswith("bearer"), case
        assert ADMIN_TOKEN not in await response.get_data(as_text=True)
    assert await conn.fetchval("SELECT count(*) FROM job_dead") == 1
    assert await conn.fetchval("SELECT count(*) FROM job") == 0


async def test_a_wrong_token_is_named_invalid_token_in_the_challenge(client: Client) -> None:
    """RFC 6750, 3.1: no bearer credentials, no error code; an empty token,
    `invalid_request`; a wrong one, `invalid_token`."""
    missing = await client.get("/workers")
    assert "error=" not in missing.headers["WWW-Authenticate"]
    basic = await client.get("/workers", headers={"Authorization": "Basic YWRtaW46YWRtaW4="})
    assert "error=" not in basic.headers["WWW-Authenticate"]
    empty = await client.get("/workers", headers={"Authorization": "Bearer "})
    assert re.search(r'\berror="?invalid_request"?', empty.headers["WWW-Authenticate"])
    wrong = await client.get("/workers", headers={"Authorization": "Bearer nope-nope-nope"})
    assert re.search(r'\berror="?invalid_token"?', wrong.headers["WWW-Authenticate"])


@pytest.mark.parametrize(("method", "path"), ADMIN_CALLS)
async def test_right_token_is_let_through(
    client: Client, conn: Connection, method: str, path: str
) -> None:
    for scheme in ("Bearer", "bearer", "BEARER"):
        await conn.execute("TRUNCATE job, job_dead")
        await bury_one(conn)
        response = await call(client, method, path, {"Authorization": f"{scheme} {ADMIN_TOKEN}"})
        assert response.status_code in (200, 204), await response.get_data(as_text=True)


async def test_unauthorised_query_errors_are_401_not_422(client: Client) -> None:
    """The token is checked before anything of the request is looked at."""
    response = await client.get("/jobs/dead?limit=abc&bogus=1")
    assert response.status_code == 401
    authorised = await client.get("/jobs/dead?limit=abc&bogus=1", headers=ADMIN)
    assert authorised.status_code == 422


@pytest.fixture
async def tokenless_client(database: Database, database_url: str) -> AsyncIterator[Client]:
    """A client of an app with no admin token configured."""
    app = create_app(make_settings(database_url))
    async with app.test_app() as test_app:
        yield test_app.test_client()
    db.bind(database)


@pytest.mark.parametrize(("method", "path"), ADMIN_CALLS)
@pytest.mark.parametrize("headers", [{}, ADMIN], ids=["no header", "a token"])
async def test_without_a_configured_token_admin_endpoints_are_404(
    tokenless_client: Client, conn: Connection, method: str, path: str, headers: dict[str, str]
) -> None:
    """No token configured: the endpoints answer exactly like an unknown URL."""
    await bury_one(conn)
    response = await call(tokenless_client, method, path, headers)
    assert response.status_code == 404
    assert "WWW-Authenticate" not in response.headers
    unknown = await tokenless_client.get("/no/such/url")
    assert await response.get_json() == await unknown.get_json()
    assert await conn.fetchval("SELECT count(*) FROM job_dead") == 1


def test_authorize_unit() -> None:
    """`authorize` alone, without HTTP: 404 when unset, 401 when wrong, silence when right."""
    unset = Settings(_env_file=None)
    with pytest.raises(NotFound):
        authorize(unset, f"Bearer {ADMIN_TOKEN}")
    configured = Settings(_env_file=None, admin_token=ADMIN_TOKEN)
    authorize(configured, f"Bearer {ADMIN_TOKEN}")
    authorize(configured, f"  bearer   {ADMIN_TOKEN}  ")
    for bad in BAD_AUTHORIZATIONS.values():
        with pytest.raises(Refused):
            authorize(configured, bad)


@pytest.mark.parametrize("token", ["", "   "])
def test_a_blank_admin_token_means_none(token: str) -> None:
    assert Settings(_env_file=None, admin_token=token).admin_token is None


@pytest.mark.parametrize(
    "weak", ["aaaaaaaaaaaaaaaa", "abababababababababab", "1234512345123451234", "short-tok3n"]
)
def test_a_weak_admin_token_is_refused_saying_how_to_make_one(weak: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(_env_file=None, admin_token=weak)
    message = str(caught.value)
    assert "secrets.token_urlsafe(32)" in message
    assert weak not in message


def test_a_weak_admin_token_stops_the_process_at_start() -> None:
    env = {
        **os.environ,
        "JOBQ_ADMIN_TOKEN": "aaaaaaaaaaaaaaaa",
        "DATABASE_URL": "postgresql://x@127.0.0.1:1/x",
    }
    done = subprocess.run(
        [sys.executable, "-m", "jobq", "serve"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert "JOBQ_ADMIN_TOKEN" in done.stderr
    assert 'python -c "import secrets; print(secrets.token_urlsafe(32))"' in done.stderr
    assert "aaaaaaaaaaaaaaaa" not in done.stderr + done.stdout


def test_a_short_admin_token_is_refused_without_echoing_it() -> None:
    short = "short-tok3n"
    with pytest.raises(ValidationError) as caught:
        Settings(_env_file=None, admin_token=short)
    assert "admin_token" in str(caught.value)
    assert short not in str(caught.value)
    assert short not in repr(caught.value)


# -- secrets never in logs, error bodies or reprs ----------------------------------------------


def test_settings_never_show_their_secrets() -> None:
    settings = Settings(
        _env_file=None,
        database_url=f"postgresql://jobq:{DB_PASSWORD}@db.example:5432/jobq",
        webhook_secret=WEBHOOK_SECRET,
        admin_token=ADMIN_TOKEN,
    )
    shown = [repr(settings), str(settings), settings.model_dump_json(), str(settings.model_dump())]
    for text in shown:
        for secret in (DB_PASSWORD, WEBHOOK_SECRET, ADMIN_TOKEN):
            assert secret not in text
    assert settings.database_url is not None
    assert DB_PASSWORD in settings.database_url.get_secret_value()  # still usable


def test_a_settings_error_never_echoes_a_secret() -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(_env_file=None, webhook_secret=WEBHOOK_SECRET, http_port=WEBHOOK_SECRET)
    assert WEBHOOK_SECRET not in str(caught.value)


async def test_admin_tokens_are_never_logged(
    client: Client, conn: Connection, caplog: pytest.LogCaptureFixture
) -> None:
    await bury_one(conn)
    sent: list[str] = []
    with caplog.at_level(logging.DEBUG):
        for method, path in ADMIN_CALLS:
            for authorization in [
                *filter(None, BAD_AUTHORIZATIONS.values()),
                ADMIN["Authorization"],
            ]:
                response = await call(client, method, path, {"Authorization": authorization})
                sent.append(await response.get_data(as_text=True))
    assert "admin request refused" in caplog.text  # refusals are logged, without the token
    for secret in (ADMIN_TOKEN, "not-the-admin-token-at-all"):
        assert secret not in caplog.text
        assert not [body for body in sent if secret in body]


def with_password(dsn: str, password: str) -> str:
    """`dsn` with `password` as its password (trust authentication ignores it)."""
    parts = urlsplit(dsn)
    user = parts.username or "postgres"
    host = parts.hostname or "127.0.0.1"
    netloc = f"{user}:{password}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


@pytest.fixture
def db_password(database_url: str) -> str:
    """The password the proxied DSN carries: the server's real one if it has one, else ours."""
    return urlsplit(database_url).password or DB_PASSWORD


def assert_secret_absent(secret: str, *texts: str) -> None:
    for text in texts:
        assert secret not in text


async def test_no_password_in_logs_or_bodies_while_the_database_is_cut_off(
    db_proxy: DatabaseProxy,
    database: Database,
    db_password: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    dsn = with_password(db_proxy.dsn, db_password)
    app = create_app(make_settings(dsn, min_pool_size=1, max_pool_size=2, admin_token=ADMIN_TOKEN))
    bodies: list[str] = []
    with caplog.at_level(logging.DEBUG):
        async with app.test_app() as test_app:
            client = test_app.test_client()
            assert (await client.get("/health")).status_code == 200
            await db_proxy.stop()
            for response in [
                await client.get("/health"),
                await client.get(
                    "/users/1", headers={"Authorization": f"Bearer {WELL_FORMED_KEY}"}
                ),
                await client.post("/users", json={"name": "Ann", "email": "ann@example.com"}),
                await client.get("/jobs/stats", headers=ADMIN),
            ]:
                assert response.status_code == 503
                body = await response.get_json()
                assert_error(body, "database_unavailable")
                bodies.append(await response.get_data(as_text=True))
            await db_proxy.start()
        db.bind(database)
    assert "database unavailable" in caplog.text
    assert_secret_absent(db_password, caplog.text, *bodies)


async def test_no_password_when_the_database_is_unreachable_at_start(
    database: Database, caplog: pytest.LogCaptureFixture
) -> None:
    dsn = f"postgresql://jobq:{DB_PASSWORD}@127.0.0.1:{free_port()}/jobq"
    app = create_app(make_settings(dsn))
    with caplog.at_level(logging.DEBUG), pytest.raises(LifespanError) as caught:
        async with app.test_app():
            pass
    db.bind(database)
    shown = "".join(traceback.format_exception(caught.value))
    assert "Connect call failed" in shown
    assert "Connect call failed" in caplog.text  # the start's failure is logged
    assert_secret_absent(DB_PASSWORD, shown, repr(caught.value), caplog.text)


async def test_no_password_in_the_output_of_a_failing_command() -> None:
    """`python -m jobq migrate` against an unreachable database fails, and says so without
    the password."""
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(PROJECT_ROOT),
        "DATABASE_URL": f"postgresql://jobq:{DB_PASSWORD}@127.0.0.1:{free_port()}/jobq",
        "JOBQ_LOG_LEVEL": "DEBUG",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "jobq",
        "migrate",
        cwd=PROJECT_ROOT,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode != 0
    text = output.decode(errors="replace")
    assert "Error" in text  # it did fail, loudly
    assert_secret_absent(DB_PASSWORD, text)


# -- webhooks: the secret, timeouts, and a bound on what is read ---------------------------------


async def deliver_due_reminder(
    client: Client, make_worker: MakeWorker, url: str, *, who: str = "ann", **overrides: Any
) -> tuple[JSON, float]:
    """Create a user with webhook `url` and a reminder due a minute ago; run its delivery once
    with a worker of the app's handlers under `settings` + `overrides`. Return the reminder
    afterwards and how long the attempt took (seconds)."""
    with freeze_time(datetime.now(UTC) - timedelta(minutes=1), real_asyncio=True):
        user = await create_user(client, email=f"{who}@example.com", webhook_url=url)
        reminder = await create_reminder(client, user["id"], message="hi", remind_in_seconds=1)
    worker = await make_worker(registry, state={}, **overrides)
    async with webhook_client(worker.settings) as http:
        worker.state.update(settings=worker.settings, http=http)
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await worker.run_once() == 1
        await worker.wait_idle()
        took = loop.time() - started
    response = await client.get(f"/reminders/{reminder['id']}")
    body: JSON = await response.get_json()
    return body, took


async def test_the_webhook_secret_is_never_logged(
    client: Client,
    make_worker: MakeWorker,
    receiver: WebhookReceiver,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.DEBUG):
        reminder, _ = await deliver_due_reminder(
            client, make_worker, receiver.url, webhook_secret=WEBHOOK_SECRET
        )
        receiver.status = 500
        failed, _ = await deliver_due_reminder(
            client, make_worker, receiver.url, who="bob", webhook_secret=WEBHOOK_SECRET
        )
    assert reminder["status"] == "sent"
    assert failed["attempts"] == 1
    assert receiver.requests[0].headers["webhook-signature"].startswith("v1,")
    assert WEBHOOK_SECRET not in caplog.text
    assert WEBHOOK_SECRET not in failed["last_error"]


@dataclass
class RawHook:
    """A raw HTTP server on 127.0.0.1 answering in a way the test chooses.

    `answer`: None to read the request and never answer; else a status sent with a body that
    never ends (written until the client hangs up, which sets `hung_up`)."""

    answer: int | None
    port: int = 0
    requests: int = 0
    hung_up: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"(?i)content-length:\s*(\d+)", head)
            await reader.readexactly(int(length.group(1)) if length else 0)
            self.requests += 1
            if self.answer is None:
                await reader.read()  # until the client gives up and closes
                return
            writer.write(f"HTTP/1.1 {self.answer} X\r\nContent-Type: text/plain\r\n\r\n".encode())
            chunk = b"x" * 65536
            while True:
                writer.write(chunk)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            self.hung_up.set()
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def serve_raw(hook: RawHook) -> AsyncIterator[RawHook]:
    server = await asyncio.start_server(hook.handle, "127.0.0.1", 0)
    hook.port = server.sockets[0].getsockname()[1]
    try:
        yield hook
    finally:
        server.close()
        await server.wait_closed()


async def test_a_webhook_that_never_answers_fails_the_attempt_at_the_read_timeout(
    client: Client, make_worker: MakeWorker
) -> None:
    async with serve_raw(RawHook(answer=None)) as hook:
        reminder, took = await deliver_due_reminder(
            client, make_worker, hook.url, webhook_timeout=timedelta(seconds=0.5)
        )
    assert hook.requests == 1
    assert reminder["status"] == "scheduled"
    assert reminder["attempts"] == 1
    assert reminder["last_error"] == "WebhookFailed: SocketTimeoutError from 127.0.0.1: timed out"
    assert 0.5 <= took < 5


@contextlib.contextmanager
def unreachable_port() -> Iterator[int]:
    """A port whose accept queue is full: a new connection's SYN is dropped, so connecting
    hangs (as to a host that is down) until the client's connect timeout."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port: int = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            fillers.append(filler)
        yield port
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


async def test_a_webhook_that_cannot_be_reached_fails_the_attempt_at_the_connect_timeout(
    client: Client, make_worker: MakeWorker
) -> None:
    with unreachable_port() as port:
        reminder, took = await deliver_due_reminder(
            client,
            make_worker,
            f"http://127.0.0.1:{port}/hook",
            webhook_connect_timeout=timedelta(seconds=0.5),
            webhook_timeout=timedelta(seconds=30),
        )
    assert reminder["status"] == "scheduled"
    assert reminder["last_error"] == (
        "WebhookFailed: ConnectionTimeoutError from 127.0.0.1: timed out"
    )
    assert 0.5 <= took < 5


@pytest.mark.parametrize(("status", "outcome"), [(200, "sent"), (500, "scheduled")])
async def test_an_endless_answer_is_not_read_past_the_bound(
    client: Client,
    make_worker: MakeWorker,
    caplog: pytest.LogCaptureFixture,
    status: int,
    outcome: str,
) -> None:
    """A webhook answering with a body that never ends: the worker reads 4 KiB, drops the
    connection, and the status decides (without the bound, the attempt would read until the
    handler's 60 s timeout)."""
    async with serve_raw(RawHook(answer=status)) as hook:
        reminder, took = await deliver_due_reminder(
            client,
            make_worker,
            hook.url,
            webhook_max_response_bytes=4096,
            webhook_timeout=timedelta(seconds=5),
        )
        await asyncio.wait_for(hook.hung_up.wait(), timeout=5)
    assert reminder["status"] == outcome
    assert took < 5
    assert "the rest was not read" in caplog.text
    if outcome == "scheduled":
        assert reminder["last_error"] == "WebhookFailed: webhook at 127.0.0.1 answered HTTP 500"


# -- SQL is parameterized everywhere -----------------------------------------------------------

SQL_WORDS = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|CREATE|DROP|ALTER|TRUNCATE|WHERE)\b")
QUERY_METHODS = {"execute", "executemany", "fetch", "fetchrow", "fetchval", "prepare", "cursor"}
ALLOWED_BUILT_SQL = {
    ("jobq/queue/leader/prune.py", "prune_finished"): "DDL takes no parameter; the partition's "
    "name is `job_done_p` and a date's %Y%m%d, read back from the catalog",
    ("jobq/queue/leader/prune.py", "_create_partition"): "DDL takes no parameter; the name and "
    "bounds are formatted from a `date`",
    ("jobq/embedded.py", "ensure_database"): "CREATE DATABASE takes no parameter; the name is "
    "checked against [a-z_][a-z0-9_]* first",
}
"""Functions allowed to build SQL text at run time, and why that is safe."""


def built_sql(path: Path) -> Iterator[tuple[str, int, str]]:
    """Yield (function, line, text) for SQL text built at run time in `path`: an f-string,
    `%` or `.format` inside a function that reads like SQL, or passed to a query method."""

    class Finder(ast.NodeVisitor):
        def __init__(self) -> None:
            self.functions: list[str] = []
            self.found: list[tuple[str, int, str]] = []

        def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
            self.functions.append(node.name)
            self.generic_visit(node)
            self.functions.pop()

        visit_AsyncFunctionDef = visit_FunctionDef

        def _built(self, node: ast.AST) -> bool:
            for part in ast.walk(node):
                if isinstance(part, ast.JoinedStr):
                    return True
                if isinstance(part, ast.BinOp) and isinstance(part.op, ast.Mod):
                    return True
                if (
                    isinstance(part, ast.Call)
                    and isinstance(part.func, ast.Attribute)
                    and part.func.attr == "format"
                ):
                    return True
            return False

        def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
            text = "".join(str(v.value) for v in node.values if isinstance(v, ast.Constant))
            if self.functions and SQL_WORDS.search(text):
                self.found.append((self.functions[-1], node.lineno, ast.unparse(node)))

        def visit_Call(self, node: ast.Call) -> None:
            method = node.func.attr if isinstance(node.func, ast.Attribute) else None
            if method in QUERY_METHODS and node.args and self._built(node.args[0]):
                function = self.functions[-1] if self.functions else "<module>"
                self.found.append((function, node.lineno, ast.unparse(node.args[0])))
            self.generic_visit(node)

    finder = Finder()
    finder.visit(ast.parse(path.read_text(), str(path)))
    yield from finder.found


def test_sql_text_is_never_built_from_run_time_values() -> None:
    """Values reach PostgreSQL as parameters ($1, ...), never inside the SQL text: no statement
    is formatted at run time except where `ALLOWED_BUILT_SQL` says why it is safe."""
    offenders = []
    for path in sorted((PROJECT_ROOT / "jobq").rglob("*.py")):
        name = path.relative_to(PROJECT_ROOT).as_posix()
        for function, line, text in built_sql(path):
            if (name, function) not in ALLOWED_BUILT_SQL:
                offenders.append(f"{name}:{line} in {function}(): {text[:80]}")
    assert offenders == []


def test_the_sql_finder_finds_what_it_looks_for(tmp_path: Path) -> None:
    source = tmp_path / "bad.py"
    source.write_text(
        "async def f(conn, name):\n"
        "    await conn.fetch(f\"SELECT * FROM users WHERE name = '{name}'\")\n"
        "    await conn.execute('DELETE FROM users WHERE id = %s' % name)\n"
        "    await conn.execute('DELETE FROM users WHERE id = {}'.format(name))\n"
        "    await conn.fetch('SELECT * FROM users WHERE id = $1', name)\n"
    )
    assert [line for _, line, _ in built_sql(source)] == [2, 2, 3, 4]


async def test_sql_looking_values_are_stored_verbatim(client: Client, conn: Connection) -> None:
    """Parameters at work: SQL in a value is data, stored and read back as sent."""
    name = "Robert'); DROP TABLE users; --"
    message = "1'; DELETE FROM job; SELECT pg_sleep(10); --"
    user = await create_user(client, name=name, email="bobby@example.com")
    reminder = await create_reminder(client, user["id"], message=message, remind_in_seconds=60)
    assert user["name"] == name
    assert reminder["message"] == message
    assert await conn.fetchval("SELECT name FROM users") == name
    assert await conn.fetchval("SELECT message FROM reminders") == message
    assert await conn.fetchval("SELECT count(*) FROM job") == 1
