"""Load through `make run`'s supervisor: the highest rate of reminder creations it serves
without errors, then 80% of it for 60 s, with every reminder due during the load delivered on
time *during* the load. Nothing may be lost.

`python -m jobq run` (the supervisor: web and worker processes, one of each per CPU by default,
`JOBQ_LOG_LEVEL=WARNING`) runs on the suite's database with `USERS` users whose webhook is a
`tests.toolkit.receiver.WebhookReceiver` in this process (keep-alive, signatures checked).
`bench.loadgen.open_loop` creates reminders at a fixed rate on a fixed schedule (users in turn),
over up to `MAX_CONNECTIONS` connections; a request that finds them all busy waits in a backlog
of one second's worth, past which it is dropped (never sent). Latency runs from each request's
scheduled time.

A rate is *held* when nothing was dropped, nothing failed, p99 latency (from the schedule)
stayed under `HELD_P99_MS`, and the step's reminders were delivered p99 within `HELD_P99_MS` of
their due time: serving reminders is accepting *and* delivering them, and a rate whose
deliveries fall ever further behind is not served, however fast its requests are answered (on
2 cores the web processes alone answer more than the workers can deliver). The ramp: steps of
`STEP_S` (reminders due 0.5 to 2 s later, each step drained before the next) from
`FIRST_RATE_PER_S`, each `RAMP` times the last, until one is not held (at most `MAX_STEPS`);
the last held is the highest rate. The first rate whose requests alone were not held is
reported too (`highest_answered_rate`: the last whose requests were). The sustained load: 80% of
it for `DURATION_S`, reminders due 1 to 10 s later; then the drain, until every reminder is
sent. The delivery lateness (first delivery minus the reminder's due time) is reported for the
reminders due while the load ran (`during_load`) and for all.

The checks: under the sustained load no 5xx, no other non-201 answer, no transport error (a
ramp step past the capacity reports its own); every reminder created in any phase ends
`sent`, its job gone from `job`, `job_running` and `job_dead`; the receiver saw each at least
once, correctly signed, and nothing else; and each was marked sent exactly once (a trigger
installed for the test records every update that sets or changes `sent_at`); the supervisor
exits 0 on SIGTERM. One JSON line of figures (`scenario: load`) is printed and appended to
`.chaos/results.jsonl`. The lateness is a figure, not a check: it depends on the machine.

`CHAOS_LOAD_DURATION_S` overrides the sustained load's duration.
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

DURATION_S = float(os.environ.get("CHAOS_LOAD_DURATION_S", "60"))
SUSTAINED = 0.8
"""The sustained load's rate, as a share of the highest held rate."""
FIRST_RATE_PER_S = 300.0
RAMP = 1.25
USERS = 200
MAX_CONNECTIONS = 64
"""Enough to keep the server busy at its capacity; more would only queue inside it."""
REQUEST_TIMEOUT_S = 30.0
HELD_P99_MS = 1000.0
STEP_S = 10.0
MAX_STEPS = 8
MAIN_DUE_IN_S = tuple(float(s) for s in range(1, 11))
"""The sustained load's reminders are due 1 to 10 s after their creation (users in turn)."""
STEP_DUE_IN_S = (0.5, 1.0, 1.5, 2.0)
"""A step's are due sooner, so that its deliveries overlap its creations as they would in a
longer run."""
DRAIN_S = 300.0
WEBHOOK_SECRET = "whsec_bG9hZC10ZXN0LXdlYmhvb2stc2VjcmV0LTMyYnl0ZXM="  # noqa: S105 (a test value)

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
    """`python -m jobq run` (the supervisor of `make run`) on the session's database:
    (process, port)."""
    port = free_port()
    proc = spawn(
        "run",
        "run",
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
        print(f"----- run (pid {proc.pid}, exit {proc.popen.returncode}) -----")
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


async def lateness_s(
    conn: Connection, receiver: WebhookReceiver, ids: set[int]
) -> dict[int, tuple[float, float]]:
    """For each delivered reminder of `ids`: (its due time, its first delivery minus its due
    time), in seconds."""
    rows = await conn.fetch("SELECT id, remind_at FROM reminders WHERE id = any($1)", list(ids))
    return {
        r["id"]: (
            r["remind_at"].timestamp(),
            min(d.received_s for d in receiver.deliveries[r["id"]]) - r["remind_at"].timestamp(),
        )
        for r in rows
        if r["id"] in receiver.deliveries
    }


async def find_highest_rate(
    load: Load, port: int, conn: Connection, proc: Proc, receiver: WebhookReceiver
) -> tuple[float, float | None, list[float | None]]:
    """Steps up from `FIRST_RATE_PER_S`, each from an empty delivery backlog, until one is not
    held; returns the last held rate (the first step's rate scaled down by its shortfall if even
    that was not held), the last rate whose requests alone were held (None: none was), and each
    step's delivery lateness p99 in ms."""
    rate = FIRST_RATE_PER_S
    highest: float | None = None
    answered: float | None = None
    step_lateness: list[float | None] = []
    for _ in range(MAX_STEPS):
        before = set(load.created)
        result = await load.run(port, rate, STEP_S, STEP_DUE_IN_S)
        await drain(conn, proc)
        late = [s for _, s in (await lateness_s(conn, receiver, load.created - before)).values()]
        p99_ms = percentile(late, 99) * 1000 if late else None
        step_lateness.append(None if p99_ms is None else round(p99_ms, 1))
        print(f"  step at {rate:.0f}/s: delivery lateness p99 {p99_ms} ms", flush=True)
        if not held(result):
            break
        answered = rate
        if p99_ms is None or p99_ms > HELD_P99_MS:
            break
        highest = rate
        rate = round(rate * RAMP, -1)
    if highest is None:
        highest = round(min(rate, result.ok_per_s) * 0.8, -1)
    return highest, answered, step_lateness


async def drain(conn: Connection, proc: Proc) -> float:
    """Wait until every reminder is sent (at most `DRAIN_S`); return the seconds it took."""
    started = time.monotonic()
    while (left := await conn.fetchval("SELECT count(*) FROM reminders WHERE sent_at IS NULL")) > 0:
        check_running((proc,))
        waited = time.monotonic() - started
        assert waited < DRAIN_S, f"{left} reminders still unsent after {DRAIN_S:g} s"
        await asyncio.sleep(0.2)
    return time.monotonic() - started


async def test_load_at_80_percent_of_the_highest_rate_delivers_on_time_and_loses_nothing(
    marks: Connection, receiver: WebhookReceiver, server: tuple[Proc, int]
) -> None:
    conn = marks
    proc, port = server
    users = await create_users(port, USERS, receiver.url)
    load = Load(users)

    highest, answered, step_lateness = await find_highest_rate(load, port, conn, proc, receiver)
    rate = round(highest * SUSTAINED, -1)
    load_started = time.time()
    main = await load.run(port, rate, DURATION_S, MAIN_DUE_IN_S)
    load_ended = time.time()
    drain_s = await drain(conn, proc)

    # -- the checks ------------------------------------------------------------------------
    # the sustained load must be clean; a ramp step past the capacity may fail requests (each
    # step reports them), but every reminder created in any phase must be delivered
    server_errors = main.server_errors
    transport_errors = sum(main.errors.values())
    other = main.answered - main.statuses[201]
    rows = await conn.fetch("SELECT id, sent_at FROM reminders")
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
        " AND state IN ('queued', 'running', 'dead')"
    )
    lost = load.created - (sent & seen)
    run_twice = sum(1 for d in receiver.deliveries.values() if len(d) > 1)
    lateness = await lateness_s(conn, receiver, in_db)
    during = [late for due, late in lateness.values() if load_started <= due <= load_ended]

    figures: dict[str, Any] = {
        "scenario": "load",
        "jobs": len(load.created),
        "lost": len(lost),
        "run_twice": run_twice,
        "highest_held_rate": highest,
        "highest_answered_rate": answered,
        "rate": rate,
        "achieved_rate": round(main.ok_per_s, 1),
        "held": held(main),
        "p50_ms": round(main.percentile_ms(50), 1),
        "p99_ms": round(main.percentile_ms(99), 1),
        "5xx": server_errors,
        "transport_errors": transport_errors,
        "dropped": main.dropped,
        "duration_s": DURATION_S,
        "drain_s": round(drain_s, 1),
        "due_during_load": len(during),
        "lateness_during_load_p50_ms": round(percentile(during, 50) * 1000, 1) if during else None,
        "lateness_during_load_p99_ms": round(percentile(during, 99) * 1000, 1) if during else None,
        "lateness_during_load_max_ms": round(max(during) * 1000, 1) if during else None,
        "lateness_all_p99_ms": round(
            percentile([late for _, late in lateness.values()], 99) * 1000, 1
        ),
        "steps": [
            {
                "rate": r.target_rate_per_s,
                "achieved": round(r.ok_per_s, 1),
                "p99_ms": round(r.percentile_ms(99), 1),
                "dropped": r.dropped,
                "5xx": r.server_errors,
                "transport_errors": sum(r.errors.values()),
                "lateness_p99_ms": late,
                "held": held(r) and late is not None and late <= HELD_P99_MS,
            }
            for r, late in zip(load.results[:-1], step_lateness, strict=True)
        ],
        "users": USERS,
        "connections_opened": main.connections_opened,
    }
    emit(figures)

    assert server_errors == 0, "5xx answers"
    assert transport_errors == 0, f"transport errors: {dict(main.errors)}"
    assert other == 0, f"answers other than 201: {dict(main.statuses)}"
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
    assert during, "no reminder was due during the load"
    assert await proc.stop() == 0
