"""Load: 1,000 reminder creations per second over HTTP for 60 s while the same process's
worker delivers them, then a drain. Nothing may be lost.

`python -m jobq serve` (hypercorn, its worker in-process, `JOBQ_LOG_LEVEL=WARNING`) runs on the
suite's database with `USERS` users whose webhook is a `tests.toolkit.receiver.WebhookReceiver` in
this process (keep-alive, signatures checked). `bench.loadgen.open_loop` creates reminders at
`TARGET_RATE_PER_S` for `DURATION_S` on a fixed schedule (users in turn; each due 1 to 10 s
later, so within the run), over up to `MAX_CONNECTIONS` connections; a request that finds
them all busy waits in a backlog of one second's worth, past which it is dropped (never sent).
Latency runs from each request's scheduled time. Then the drain: until every reminder is sent.

The rate is *held* when nothing was dropped, nothing failed, and p99 latency (from the
schedule) stayed under `HELD_P99_MS`. When the target is not held, short steps (`STEP_S`
each, at most `MAX_STEPS`, reminders due 0.5 to 2 s later, each step drained before the next)
look for the highest rate that is, starting just under the rate achieved;
their reminders are checked like the others.

The checks: no 5xx, no other non-201 answer, no transport error; every reminder created ends
`sent`, its job gone from `job`, `job_running` and `job_dead`; the receiver saw each at least
once, correctly signed, and nothing else; and each was marked sent exactly once (a trigger
installed for the test records every update that sets or changes `sent_at`). One JSON line of
figures (`scenario: load`) is printed and appended to `.chaos/results.jsonl`: besides the
rates and latencies, `run_twice` (reminders delivered more than once), `drain_s` (after the
main run) and the delivery lateness (first delivery minus the reminder's due time).

`CHAOS_LOAD_RATE` and `CHAOS_LOAD_DURATION_S` override the target rate and the duration.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bench.http_bench import SERVE_ENV, BenchUser, create_users
from bench.loadgen import Request, Result, open_loop, percentile
from jobq import db
from jobq.db import Connection, Database
from tests.chaos.helpers import emit
from tests.toolkit.procs import Proc, check_running, free_port, http_ready, spawn
from tests.toolkit.receiver import WebhookReceiver

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(900)]

TARGET_RATE_PER_S = float(os.environ.get("CHAOS_LOAD_RATE", "1000"))
DURATION_S = float(os.environ.get("CHAOS_LOAD_DURATION_S", "60"))
USERS = 200
MAX_CONNECTIONS = 64
"""Enough to keep the server busy at its capacity; more would only queue inside it."""
REQUEST_TIMEOUT_S = 30.0
HELD_P99_MS = 1000.0
STEP_S = 10.0
MAX_STEPS = 3
MAIN_DUE_IN_S = tuple(float(s) for s in range(1, 11))
"""The main run's reminders are due 1 to 10 s after their creation (users in turn)."""
STEP_DUE_IN_S = (0.5, 1.0, 1.5, 2.0)
"""A step's are due sooner, so that its deliveries overlap its creations as they would in a
longer run."""
DRAIN_S = 300.0
WEBHOOK_SECRET = "load-test-webhook-secret"  # noqa: S105 (a test value)

MARKS_SQL = """
CREATE TABLE test_load_mark (reminder_id bigint NOT NULL, sent_at timestamptz NOT NULL);
CREATE FUNCTION test_load_mark() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO test_load_mark VALUES (NEW.id, NEW.sent_at);
    RETURN NULL;
END $$;
CREATE TRIGGER test_load_mark AFTER UPDATE OF sent_at ON reminders
    FOR EACH ROW WHEN (NEW.sent_at IS DISTINCT FROM OLD.sent_at)
    EXECUTE FUNCTION test_load_mark();
"""
"""One row per update that sets or changes a reminder's `sent_at`: a reminder marked sent
twice would have two."""

UNMARKS_SQL = """
DROP TRIGGER IF EXISTS test_load_mark ON reminders;
DROP FUNCTION IF EXISTS test_load_mark();
DROP TABLE IF EXISTS test_load_mark;
"""


@pytest.fixture
async def marks(database: Database) -> AsyncIterator[Connection]:
    """A connection of the test's own, with the marks trigger installed on emptied tables;
    removed at the end."""
    conn = await db.connect(database.dsn)
    await conn.execute(UNMARKS_SQL + MARKS_SQL)
    yield conn
    await conn.execute(UNMARKS_SQL)
    await conn.close()


@pytest.fixture
async def receiver() -> AsyncIterator[WebhookReceiver]:
    hooks = WebhookReceiver(secret=WEBHOOK_SECRET)
    await hooks.start()
    yield hooks
    await hooks.close()


@pytest.fixture
async def server(database: Database, tmp_path: Path) -> AsyncIterator[tuple[Proc, int]]:
    """`python -m jobq serve` with its worker on the session's database: (process, port)."""
    port = free_port()
    proc = spawn(
        "serve",
        "serve",
        database_url=database.dsn,
        log_dir=tmp_path,
        env={
            **SERVE_ENV,
            "JOBQ_HTTP_HOST": "127.0.0.1",
            "JOBQ_HTTP_PORT": str(port),
            "JOBQ_WEBHOOK_SECRET": WEBHOOK_SECRET,
            "JOBQ_LOG_LEVEL": "WARNING",
        },
    )
    try:
        await http_ready(port, proc)
        yield proc, port
    finally:
        await proc.stop()
        print(f"----- serve (pid {proc.pid}, exit {proc.popen.returncode}) -----")
        print(proc.log()[-5000:])


class Load:
    """The reminders requested and what came of them, over every phase."""

    def __init__(self, users: list[BenchUser]) -> None:
        self.users = users
        self.sequence = 0
        self.due_in_s: tuple[float, ...] = MAIN_DUE_IN_S
        self.created: set[int] = set()
        self.results: list[Result] = []

    def request(self, _: int) -> Request:
        i = self.sequence
        self.sequence += 1
        due_in_s = self.due_in_s[i % len(self.due_in_s)]
        body = {"message": f"load {i}", "remind_in_seconds": due_in_s}
        user_id, key = self.users[i % len(self.users)]
        return Request.json("POST", f"/users/{user_id}/reminders", body, key=key)

    def answered(self, request: Request, status: int, body: bytes) -> None:
        if status == 201:
            reminder = json.loads(body)
            self.created.add(reminder["id"])

    async def run(
        self, port: int, rate: float, duration_s: float, due_in_s: tuple[float, ...]
    ) -> Result:
        self.due_in_s = due_in_s
        result = await open_loop(
            "127.0.0.1",
            port,
            self.request,
            rate_per_s=rate,
            duration_s=duration_s,
            max_connections=MAX_CONNECTIONS,
            timeout_s=REQUEST_TIMEOUT_S,
            on_response=self.answered,
        )
        self.results.append(result)
        print(f"load at {rate:.0f}/s for {duration_s:g} s: {result.summary()}", flush=True)
        return result


def held(result: Result) -> bool:
    """Whether the open loop's rate was held (see the module's docstring)."""
    return (
        result.dropped == 0
        and not result.errors
        and result.ok == result.answered
        and result.percentile_ms(99) <= HELD_P99_MS
    )


async def find_held_rate(
    load: Load, port: int, achieved: float, conn: Connection, proc: Proc
) -> float | None:
    """Short steps down from just under the rate `achieved`, each from an empty delivery
    backlog; the first held rate, or None."""
    rate = max(10.0, round(achieved * 0.9, -1))
    for _ in range(MAX_STEPS):
        result = await load.run(port, rate, STEP_S, STEP_DUE_IN_S)
        await drain(conn, proc)
        if held(result):
            return rate
        rate = max(10.0, round(min(rate, result.ok_per_s) * 0.8, -1))
    return None


async def drain(conn: Connection, proc: Proc) -> float:
    """Wait until every reminder is sent (at most `DRAIN_S`); return the seconds it took."""
    started = time.monotonic()
    while (left := await conn.fetchval("SELECT count(*) FROM reminders WHERE sent_at IS NULL")) > 0:
        check_running((proc,))
        waited = time.monotonic() - started
        assert waited < DRAIN_S, f"{left} reminders still unsent after {DRAIN_S:g} s"
        await asyncio.sleep(0.2)
    return time.monotonic() - started


async def test_load_1000_reminders_per_second_loses_nothing(
    marks: Connection, receiver: WebhookReceiver, server: tuple[Proc, int]
) -> None:
    conn = marks
    proc, port = server
    users = await create_users(port, USERS, receiver.url)
    load = Load(users)

    main = await load.run(port, TARGET_RATE_PER_S, DURATION_S, MAIN_DUE_IN_S)
    drain_s = await drain(conn, proc)
    if held(main):
        held_rate: float | None = TARGET_RATE_PER_S
    else:
        held_rate = await find_held_rate(load, port, main.ok_per_s, conn, proc)

    # -- the checks ------------------------------------------------------------------------
    server_errors = sum(r.server_errors for r in load.results)
    transport_errors = sum(sum(r.errors.values()) for r in load.results)
    other = sum(r.answered - r.statuses[201] for r in load.results)
    rows = await conn.fetch("SELECT id, remind_at, sent_at FROM reminders")
    in_db = {r["id"] for r in rows}
    sent = {r["id"] for r in rows if r["sent_at"] is not None}
    seen = set(receiver.deliveries)
    mark_counts = {
        r["reminder_id"]: r["n"]
        for r in await conn.fetch(
            "SELECT reminder_id, count(*) AS n FROM test_load_mark GROUP BY reminder_id"
        )
    }
    leftover_jobs = await conn.fetchval(
        "SELECT count(*) FROM job_state WHERE job_type = 'send_reminder'"
    )
    lost = load.created - (sent & seen)
    run_twice = sum(1 for d in receiver.deliveries.values() if len(d) > 1)
    lateness = [
        min(d.received_s for d in receiver.deliveries[r["id"]]) - r["remind_at"].timestamp()
        for r in rows
        if r["id"] in seen
    ]

    figures: dict[str, Any] = {
        "scenario": "load",
        "jobs": len(load.created),
        "lost": len(lost),
        "run_twice": run_twice,
        "target_rate": TARGET_RATE_PER_S,
        "achieved_rate": round(main.ok_per_s, 1),
        "held": held(main),
        "highest_held_rate": held_rate,
        "p50_ms": round(main.percentile_ms(50), 1),
        "p99_ms": round(main.percentile_ms(99), 1),
        "5xx": server_errors,
        "transport_errors": transport_errors,
        "dropped": main.dropped,
        "duration_s": DURATION_S,
        "drain_s": round(drain_s, 1),
        "delivery_lateness_p50_ms": round(percentile(lateness, 50) * 1000, 1),
        "delivery_lateness_p99_ms": round(percentile(lateness, 99) * 1000, 1),
        "steps": [
            {
                "rate": r.target_rate_per_s,
                "achieved": round(r.ok_per_s, 1),
                "p99_ms": round(r.percentile_ms(99), 1),
                "dropped": r.dropped,
                "held": held(r),
            }
            for r in load.results[1:]
        ],
        "users": USERS,
        "connections_opened": main.connections_opened,
    }
    emit(figures)

    assert server_errors == 0, "5xx answers"
    assert transport_errors == 0, f"transport errors: {[dict(r.errors) for r in load.results]}"
    assert other == 0, f"answers other than 201: {[dict(r.statuses) for r in load.results]}"
    assert load.created, "no reminder was created"
    assert in_db == load.created, "the database's reminders differ from those created"
    assert not lost, (
        f"{len(lost)} reminders lost (not sent or never delivered): {sorted(lost)[:20]}"
    )
    assert seen == load.created, f"deliveries of unknown reminders: {sorted(seen - in_db)[:20]}"
    assert receiver.bad_signatures == 0
    assert receiver.malformed == 0
    assert mark_counts == dict.fromkeys(load.created, 1), "a reminder not marked sent exactly once"
    assert leftover_jobs == 0, "send_reminder jobs left in job, job_running or job_dead"
    assert await proc.stop() == 0
