"""The queues' admin endpoints (GET /queues, POST /queues/<name>/pause|resume) and bad input
for queues: an unknown queue in a request (404 JSON), a malformed or unknown `JOBQ_QUEUES` or
a limit <= 0 (one line on stderr and exit 1 at start), `Registry.queue` with a limit <= 0
(`ValueError`); nothing is written in any case."""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel
from quart.typing import TestClientProtocol as Client

from jobq.config import PROJECT_ROOT, Settings
from jobq.db import Connection
from jobq.queue import Job, JobContext, Registry, enqueue
from jobq.queue.registry import Rate
from tests.api.conftest import ADMIN, ADMIN_TOKEN
from tests.api.helpers import assert_error
from tests.conftest import make_settings
from tests.queue.helpers import Gate, MakeWorker
from tests.toolkit.procs import eventually, subprocess_env

START_S = 60.0
"""How long `python -m jobq worker` may take to fail at start (a cold start on a busy box)."""


@pytest.fixture
def settings(database_url: str) -> Settings:
    """The test settings, with an admin token."""
    return make_settings(database_url, admin_token=ADMIN_TOKEN)


class Args(BaseModel):
    n: int = 0


def mail_queue(gate: Gate) -> Registry:
    """Queue `mail` with every kind of limit, and a handler held at `gate`."""
    handlers = Registry()
    handlers.queue(
        "mail",
        max_running=5,
        max_running_per_key=2,
        rate=Rate(10, timedelta(seconds=1)),
        rate_per_key=Rate(3, timedelta(minutes=1)),
    )

    @handlers.handler("send", args=Args, queue="mail")
    async def send(args: Args, job: JobContext) -> None:
        await gate.enter(job.id)

    return handlers


def mail(n: int, **extra: Any) -> Job:
    return Job(job_type="send", arguments={"n": n}, queue="mail", **extra)


async def queue_rows(conn: Connection) -> list[dict[str, Any]]:
    return [dict(r) for r in await conn.fetch("SELECT * FROM job_queue ORDER BY name")]


# -- GET /queues -------------------------------------------------------------------------------


async def test_queues_are_listed_with_depth_running_limits_and_paused(
    client: Client, make_worker: MakeWorker
) -> None:
    gate = Gate()
    worker = await make_worker(mail_queue(gate), queues={"mail": 1})
    await enqueue(mail(1, concurrency_key="k"))
    await enqueue(mail(2, concurrency_key="k"))
    await enqueue(mail(3).runs_in(hours=1))
    assert await worker.run_once() == 1

    response = await client.get("/queues", headers=ADMIN)
    assert response.status_code == 200
    queues = {q["name"]: q for q in (await response.get_json())["queues"]}
    assert queues["mail"] == {
        "name": "mail",
        "paused": False,
        "max_running": 5,
        "max_running_per_key": 2,
        "rate": {"max_starts": 10, "period_s": 1.0},
        "rate_per_key": {"max_starts": 3, "period_s": 60.0},
        "ripe": 1,
        "scheduled": 1,
        "running": 1,
    }
    assert queues["default"]["max_running"] is None
    assert queues["default"]["rate"] is None

    assert (await client.post("/queues/mail/pause", headers=ADMIN)).status_code == 204
    listed = await (await client.get("/queues", headers=ADMIN)).get_json()
    assert {q["name"]: q["paused"] for q in listed["queues"]} == {"default": False, "mail": True}
    gate.release()


# -- pause and resume --------------------------------------------------------------------------


async def test_a_pause_stops_claims_and_a_resume_restarts_them(
    client: Client, conn: Connection, make_worker: MakeWorker
) -> None:
    gate = Gate()
    gate.release()
    worker = await make_worker(mail_queue(gate), queues={"mail": 4})
    response = await client.post("/queues/mail/pause", headers=ADMIN)
    assert response.status_code == 204
    assert await conn.fetchval("SELECT paused FROM job_queue WHERE name = 'mail'")

    first = (await enqueue(mail(1))).id  # enqueueing into a paused queue works
    assert await worker.run_once() == 0
    assert await conn.fetchval("SELECT count(*) FROM job WHERE id = $1", first) == 1
    assert (await client.post("/queues/mail/pause", headers=ADMIN)).status_code == 204  # again
    assert await worker.run_once() == 0

    assert (await client.post("/queues/mail/resume", headers=ADMIN)).status_code == 204
    assert not await conn.fetchval("SELECT paused FROM job_queue WHERE name = 'mail'")
    assert await worker.run_once() == 1
    await worker.wait_idle()
    assert gate.entered == [first]


@pytest.mark.parametrize("action", ["pause", "resume"])
async def test_an_unknown_queue_is_404_and_nothing_is_written(
    client: Client, conn: Connection, action: str
) -> None:
    before = await queue_rows(conn)
    for name in ("nope", "Not%20A%20Name"):
        response = await client.post(f"/queues/{name}/{action}", headers=ADMIN)
        assert response.status_code == 404
        assert_error(await response.get_json(), "not_found")
    assert await queue_rows(conn) == before


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": ADMIN_TOKEN}],
    ids=["no token", "wrong token", "not bearer"],
)
async def test_the_queue_endpoints_need_the_admin_token(
    client: Client, conn: Connection, headers: dict[str, str]
) -> None:
    await conn.execute("INSERT INTO job_queue (name) VALUES ('mail')")
    before = await queue_rows(conn)
    for method, url in (
        ("GET", "/queues"),
        ("POST", "/queues/mail/pause"),
        ("POST", "/queues/default/pause"),
        ("POST", "/queues/mail/resume"),
    ):
        call = client.get if method == "GET" else client.post
        response = await call(url, headers=headers)
        assert response.status_code == 401, url
        assert_error(await response.get_json(), "unauthorized")
    assert await queue_rows(conn) == before


async def test_without_an_admin_token_set_the_queue_endpoints_are_404(
    database_url: str, conn: Connection
) -> None:
    from jobq.app import create_app

    app = create_app(make_settings(database_url))
    async with app.test_app() as test_app:
        client = test_app.test_client()
        for method, url in (("GET", "/queues"), ("POST", "/queues/default/pause")):
            call = client.get if method == "GET" else client.post
            response = await call(url, headers=ADMIN)
            assert response.status_code == 404
    assert not await conn.fetchval("SELECT paused FROM job_queue WHERE name = 'default'")


# -- bad input at start ------------------------------------------------------------------------


async def start_worker(database_url: str, **env: str) -> tuple[int, str, str]:
    """Run `python -m jobq worker` with `env`; return its exit code, stdout and stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "jobq",
        "worker",
        cwd=PROJECT_ROOT,
        env=subprocess_env(database_url, env),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(START_S):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"JOBQ_QUEUES": "nope:2"}, "nope"),
        ({"JOBQ_QUEUES": "reminders:4,nope:2,other:1"}, "nope"),
        ({"JOBQ_QUEUES": "bad"}, "JOBQ_QUEUES"),
        ({"JOBQ_QUEUES": "reminders:0"}, "JOBQ_QUEUES"),
        ({"JOBQ_QUEUES": "reminders:-1"}, "JOBQ_QUEUES"),
        ({"JOBQ_QUEUES": "reminders:two"}, "JOBQ_QUEUES"),
        ({"JOBQ_REMINDER_HOST_MAX_RUNNING": "0"}, "JOBQ_REMINDER_HOST_MAX_RUNNING"),
        ({"JOBQ_REMINDER_HOST_RATE": "0"}, "JOBQ_REMINDER_HOST_RATE"),
        ({"JOBQ_REMINDER_HOST_RATE_PERIOD_S": "0"}, "JOBQ_REMINDER_HOST_RATE_PERIOD_S"),
    ],
)
async def test_a_bad_queue_setting_stops_the_worker_at_start_with_one_line(
    database_url: str, conn: Connection, env: dict[str, str], named: str
) -> None:
    before = (await queue_rows(conn), await conn.fetchval("SELECT count(*) FROM worker"))
    code, out, err = await start_worker(database_url, **env)
    assert code == 1
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("jobq: ")
    assert named in lines[0]
    assert "Traceback" not in err
    after = (await queue_rows(conn), await conn.fetchval("SELECT count(*) FROM worker"))
    assert after == before  # no queue declared, no worker registered


async def test_a_good_queue_setting_starts_the_worker(database_url: str, conn: Connection) -> None:
    """The counterpart of the bad settings: the same start with a valid `JOBQ_QUEUES` gets as
    far as registering the worker (then it is stopped)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "jobq",
        "worker",
        cwd=PROJECT_ROOT,
        env=subprocess_env(database_url, {"JOBQ_QUEUES": "reminders:2,exports:1"}),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:

        async def registered() -> bool:
            found: bool = await conn.fetchval(
                "SELECT EXISTS (SELECT FROM worker WHERE pid = $1)", proc.pid
            )
            return found

        await eventually(registered, within=START_S)
    finally:
        proc.terminate()
        await proc.wait()
    assert proc.returncode == 0


# -- bad input in code -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_running", 0), ("max_running_per_key", 0), ("slots", 0), ("max_running", -3)],
)
def test_a_limit_below_one_is_a_value_error(field: str, value: int) -> None:
    handlers = Registry()
    before = handlers.queues()
    limits: dict[str, Any] = {field: value}
    with pytest.raises(ValueError, match=field):
        handlers.queue("mail", **limits)
    assert handlers.queues() == before  # not declared


@pytest.mark.parametrize(
    ("max_starts", "period"), [(0, timedelta(seconds=1)), (1, timedelta(0)), (-1, timedelta(1))]
)
def test_a_rate_below_one_or_without_a_period_is_a_value_error(
    max_starts: int, period: timedelta
) -> None:
    with pytest.raises(ValueError, match="rate"):
        Rate(max_starts, period)


def test_a_malformed_queue_name_is_a_value_error() -> None:
    handlers = Registry()
    for name in ("", "Mail", "1st", "a b", "x" * 64):
        with pytest.raises(ValueError, match="queue name"):
            handlers.queue(name)
    assert set(handlers.queues()) == {"default"}
