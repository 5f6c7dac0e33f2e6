"""The HTTP workload, `http_reminders`: reminders created over HTTP while the workers deliver
them, against a bare endpoint measured in the same run.

What is measured, exactly, once per server (`"server"` in the line): `python -m jobq serve`
(hypercorn, one process, its worker running in it: `JOBQ_RUN_WORKERS=true`), then `python -m
jobq run` (what `make run` runs: the supervisor, with its web and worker processes, one of each
per CPU), each with default settings but `JOBQ_LOG_LEVEL=WARNING`, so no access log line per
request, `JOBQ_WEBHOOK_ALLOW_PRIVATE=true` for the local receiver and no per-key rate limit, on
a free port and a fresh database; `USERS` users whose webhook is a `WebhookReceiver` in this
process (keep-alive, signature checked). Then `bench.loadgen.closed_loop`: `CONNECTIONS` (32)
keep-alive connections for `DURATION_S` (10) seconds, each `POST /users/<id>/reminders` (users in
turn, each with its API key) due 0.5 to 2 s later, so the worker delivers them while the load
goes on. `req_per_s`: 201 answers per second; `p50_ms`/`p99_ms`: latency of every answer;
`errors`: non-201 answers plus transport errors and timeouts. Then the load stops and
`delivered` counts the reminders the receiver got within `DELIVERY_WAIT_S`, `drain_s` how long
after the load the last one arrived. Then `python -m bench.bare` (same settings, same
hypercorn set-up, one process) under the same load for `BARE_DURATION_S` (5 s):
`bare_req_per_s` on both lines; `ratio_to_bare` is each line's req_per_s over it.
"""

from __future__ import annotations

import json
import time

from bench import loadgen
from bench.context import Context, Figures
from bench.loadgen import Request, closed_loop
from tests.toolkit.procs import check_running, free_port, http_ready
from tests.toolkit.receiver import WebhookReceiver

USERS = 100
CONNECTIONS = 32
DURATION_S = 10.0
SERVERS = ("serve", "run")
BARE_DURATION_S = 5.0
DELIVERY_WAIT_S = 60.0
WEBHOOK_SECRET = "bench-webhook-secret"  # noqa: S105 (a benchmark's value)


BenchUser = tuple[int, str]
"""A user's id and API key."""

SERVE_ENV = {
    "JOBQ_RUN_WORKERS": "true",
    "JOBQ_WEBHOOK_SECRET": WEBHOOK_SECRET,
    "JOBQ_WEBHOOK_ALLOW_PRIVATE": "true",  # the receiver listens on 127.0.0.1
    "JOBQ_RATE_LIMIT_PER_S": "0",  # measured without the per-key rate limit
    "JOBQ_SIGNUP_RATE_PER_HOUR": "0",  # ... nor the sign-ups' per address (one makes them all)
    # every user's webhook is the one receiver, one host: lift its per-host delivery limits
    # (20 per second by default), which would pace the run rather than measure it
    "JOBQ_REMINDER_HOST_MAX_RUNNING": "1000",
    "JOBQ_REMINDER_HOST_RATE": "1000000",
}
"""The settings of the measured server, besides its address."""


async def create_users(port: int, count: int, webhook_url: str | None) -> list[BenchUser]:
    """Create `count` users over HTTP (`bench-<i>@example.com`); return their ids and keys."""
    users = []
    for i in range(count):
        body = {"name": f"bench {i}", "email": f"bench-{i}@example.com", "webhook_url": webhook_url}
        status, answer = await loadgen.fetch(
            "127.0.0.1", port, Request.json("POST", "/users", body)
        )
        if status != 201:
            raise RuntimeError(f"creating a user: HTTP {status} {answer[:200]!r}")
        created = json.loads(answer)
        users.append((int(created["id"]), str(created["api_key"])))
    return users


def reminder_request(users: list[BenchUser], i: int) -> Request:
    """The `i`-th reminder: for the users in turn (with their keys), due 0.5 to 2 s later."""
    body = {"message": f"bench {i}", "remind_in_seconds": 0.5 + (i % 16) / 10}
    user_id, key = users[i % len(users)]
    return Request.json("POST", f"/users/{user_id}/reminders", body, key=key)


async def http_reminders(ctx: Context) -> list[Figures]:
    """One line per server (`serve`, then `run`), each with the bare endpoint's rate of this
    run."""
    lines = [await _reminders(ctx, command) for command in SERVERS]
    bare = await _bare(ctx)
    for line in lines:
        line["bare_req_per_s"] = round(bare, 1)
        line["ratio_to_bare"] = round(line["req_per_s"] / bare, 3)
    return lines


async def _reminders(ctx: Context, command: str) -> Figures:
    """Reminder creations against `python -m jobq <command>` on a fresh database."""
    await ctx.database.reset()
    receiver = WebhookReceiver(secret=WEBHOOK_SECRET)
    await receiver.start()
    port = free_port()
    server = ctx.spawn(
        command,
        command,
        JOBQ_HTTP_HOST="127.0.0.1",
        JOBQ_HTTP_PORT=str(port),
        **SERVE_ENV,
    )
    try:
        await http_ready(port, server)
        users = await create_users(port, USERS, receiver.url)
        result = await closed_loop(
            "127.0.0.1",
            port,
            lambda i: reminder_request(users, i),
            connections=CONNECTIONS,
            duration_s=DURATION_S,
        )
        load_end = time.time()
        await receiver.wait_delivered(result.statuses[201], timeout_s=DELIVERY_WAIT_S)
        last_s = max((d[-1].received_s for d in receiver.deliveries.values()), default=load_end)
        check_running((server,))
    finally:
        await server.stop()
        await receiver.close()
    created = result.statuses[201]
    return {
        "server": command,
        "req_per_s": round(created / result.elapsed_s, 1),
        "p50_ms": round(result.percentile_ms(50), 2),
        "p99_ms": round(result.percentile_ms(99), 2),
        "errors": result.answered - created + sum(result.errors.values()),
        "delivered": receiver.delivered,
        "undelivered": created - receiver.delivered,
        "bad_signatures": receiver.bad_signatures,
        "drain_s": round(max(0.0, last_s - load_end), 2),
    }


async def _bare(ctx: Context) -> float:
    """The bare endpoint's 201 answers per second under the same load."""
    port = free_port()
    server = ctx.spawn(
        "",
        "bare",
        module="bench.bare",
        JOBQ_HTTP_HOST="127.0.0.1",
        JOBQ_HTTP_PORT=str(port),
    )
    try:
        await http_ready(port, server)
        result = await closed_loop(
            "127.0.0.1",
            port,
            lambda i: Request.json("POST", "/bare", {"message": f"bench {i}"}),
            connections=CONNECTIONS,
            duration_s=BARE_DURATION_S,
        )
        check_running((server,))
    finally:
        await server.stop()
    if result.statuses[201] != result.answered or result.errors:
        raise RuntimeError(f"the bare endpoint failed: {result.summary()}")
    return result.statuses[201] / result.elapsed_s
