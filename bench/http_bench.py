"""The HTTP workload, `http_reminders`: what a user of `make run` meets when creating reminders
over HTTP while the workers deliver them, against the bare endpoint served the same way in the
same run.

One line per user count (`USER_COUNTS`: 1, then 100), each measured thus on a fresh database:

1. The bare endpoint (`python -m bench.bare`: one INSERT per POST, one hypercorn process on
   uvloop, with the access log) under the same load for `BARE_DURATION_S`, before and after
   the reminders' load (the machine's other load drifts): `bare_req_per_s`, their mean.
2. `python -m jobq run`, what `make run` runs (the supervisor, one web and one worker process
   per CPU), with its default settings (`JOBQ_LOG_LEVEL=INFO`: an access log line per
   request) but `RUN_ENV`: the per-key rate limit and the per-user cap lifted, the per-host
   delivery limits lifted (every webhook is the one receiver), webhooks to 127.0.0.1 allowed.
   `users` users are made over HTTP, each with a webhook at a `WebhookReceiver` in this process
   (keep-alive, signature checked).
3. `bench.loadgen.closed_loop`: `CONNECTIONS` (32) keep-alive connections, each sending
   `POST /users/<id>/reminders` (the users in turn, each with its API key), due 0.5 to 2 s
   later, so that the workers deliver them while the load goes on: a `WARM_UP_S` warm-up, then
   `DURATION_S` measured.

Where the CPU goes, when the server is a process of this machine: `cpu_ms_web`,
`cpu_ms_worker`, `cpu_ms_app` (the supervisor) and `cpu_ms_db` (the server's processes) per
reminder created in the measured load, counted over it (the deliveries run beside it); and
`bare_cpu_ms_app` and `bare_cpu_ms_db` per bare request, the mean of the two measures around
the line. The load generator and the receiver (this process) are not counted.

Figures: `created_per_s` (201 answers per second of the measured load), `p50_ms`/`p99_ms`
(latency of its answers), `errors` (other answers, transport errors, timeouts);
`ratio_to_bare` = `created_per_s` / `bare_req_per_s`. `delivered_per_s_during_load`: first
deliveries of any reminder that arrived during the measured load, per second. Lateness (arrival
at the receiver minus the `remind_at` in the body, in seconds) of the reminders created in the
measured load, those that arrived during it (`lateness_p50_s`, `lateness_p99_s`,
`lateness_max_s`) and those that arrived after it (`after_lateness_p50_s`, ...; NaN when none);
`drain_s`: from the end of the load to the last arrival. `lost`: reminders created and not
delivered within `DELIVERY_WAIT_S`; `duplicates`: reminders delivered more than once;
`bad_signatures`.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable

import psutil  # type: ignore[import-untyped]

from bench import loadgen
from bench.context import Context, Figures
from bench.harness import postmaster, server_cpu_s
from bench.loadgen import Request, closed_loop, percentile
from tests.toolkit.procs import Proc, check_running, free_port, http_ready
from tests.toolkit.receiver import WebhookReceiver

USER_COUNTS = (1, 100)
CONNECTIONS = 32
WARM_UP_S = 1.0
DURATION_S = 30.0
BARE_DURATION_S = 5.0
DELIVERY_WAIT_S = 60.0
WEBHOOK_SECRET = "whsec_YmVuY2gtd2ViaG9vay1zZWNyZXQtb2YtMzItYnl0ZXM="  # noqa: S105 (a benchmark's value)


BenchUser = tuple[int, str]
"""A user's id and API key."""

LIFTED_LIMITS = {
    "JOBQ_WEBHOOK_SECRET": WEBHOOK_SECRET,
    "JOBQ_WEBHOOK_ALLOW_PRIVATE": "true",  # the receiver listens on 127.0.0.1
    "JOBQ_RATE_LIMIT_PER_S": "0",  # measured without the per-key rate limit
    "JOBQ_SIGNUP_RATE_PER_HOUR": "0",  # ... nor the sign-ups' per address (one makes them all)
    # every user's webhook is the one receiver, one address: lift its per-address delivery
    # limits (20 per second by default) and the per-user share, which would pace the run rather
    # than measure it
    "JOBQ_REMINDER_HOST_MAX_RUNNING": "1000",
    "JOBQ_REMINDER_HOST_RATE": "1000000",
    "JOBQ_REMINDER_USER_MAX_RUNNING": "1000",
}

SERVE_ENV = {"JOBQ_RUN_WORKERS": "true", **LIFTED_LIMITS}
"""The settings of a `python -m jobq serve` under load (`tests.chaos.test_load`)."""

RUN_ENV = {
    **LIFTED_LIMITS,
    "JOBQ_LOG_LEVEL": "INFO",  # `make run`'s: an access log line per request
    "JOBQ_MAX_REMINDERS_PER_USER": "100000000",  # one user makes every reminder
}
"""The settings of the measured `python -m jobq run` (and of the bare endpoint's log)."""


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


class CpuMeter:
    """CPU seconds (user + system) of the served process `served` (a pid) and its children by
    role, and of the database server's processes (`db`; none when `server` is None)."""

    def __init__(self, served: int, server: psutil.Process | None) -> None:
        self.served = served
        self.server = server

    def read(self) -> dict[str, float]:
        """CPU seconds so far: `web` (`serve` processes), `worker`, `app` (the served process
        itself, unless it is one of those), `db`."""
        root = psutil.Process(self.served)
        spent: dict[str, float] = {}
        for process in [root, *root.children()]:
            with contextlib.suppress(psutil.NoSuchProcess):
                command = " ".join(process.cmdline())
                times = process.cpu_times()
                role = "web" if " serve" in command else "worker" if " worker" in command else "app"
                spent[role] = spent.get(role, 0.0) + times.user + times.system
        if self.server is not None:
            spent["db"] = server_cpu_s(self.server)
        return spent

    @staticmethod
    def per(count: int, before: dict[str, float], after: dict[str, float], prefix: str) -> Figures:
        """`<prefix><role>`: the milliseconds of CPU each role spent per one of `count`."""
        return {
            f"{prefix}{role}": round(
                (after[role] - before.get(role, 0.0)) * 1000 / max(count, 1), 3
            )
            for role in sorted(after)
        }


async def http_reminders(ctx: Context) -> list[Figures]:
    """One line per user count. The bare endpoint is measured before and after each user
    count's load; each line's `bare_req_per_s` is the mean of the two measures around it (the
    machine's other load drifts)."""
    port = free_port()
    bare_server = ctx.spawn(
        "",
        "bare",
        module="bench.bare",
        JOBQ_HTTP_HOST="127.0.0.1",
        JOBQ_HTTP_PORT=str(port),
        JOBQ_LOG_LEVEL=RUN_ENV["JOBQ_LOG_LEVEL"],
    )
    async with ctx.connection() as conn:
        server = await postmaster(conn)
    lines = []
    try:
        await http_ready(port, bare_server)
        await _load(port, bare_server, _bare_request, WARM_UP_S)
        bare_meter = CpuMeter(bare_server.pid, server)
        bare = [await _bare(port, bare_server, bare_meter)]
        for users in USER_COUNTS:
            line = await _reminders(ctx, users, server)
            bare.append(await _bare(port, bare_server, bare_meter))
            (rate, cpu), (rate_after, cpu_after) = bare[-2:]
            line["bare_req_per_s"] = round((rate + rate_after) / 2, 1)
            line["ratio_to_bare"] = round(line["created_per_s"] / line["bare_req_per_s"], 3)
            line.update({name: round((cpu[name] + cpu_after[name]) / 2, 3) for name in cpu})
            lines.append(line)
    finally:
        await bare_server.stop()
    return lines


async def _reminders(ctx: Context, users_count: int, server: psutil.Process | None) -> Figures:
    """Reminder creations for `users_count` users against `python -m jobq run` (the database
    server's processes: `server`)."""
    await ctx.database.reset()
    receiver = WebhookReceiver(secret=WEBHOOK_SECRET)
    await receiver.start()
    port = free_port()
    served = ctx.spawn(
        "run",
        f"run-{users_count}-users",
        JOBQ_HTTP_HOST="127.0.0.1",
        JOBQ_HTTP_PORT=str(port),
        **RUN_ENV,
    )
    warm: list[int] = []
    created: list[int] = []

    def collect(into: list[int]) -> loadgen.OnResponse:
        def on_response(request: Request, status: int, body: bytes) -> None:
            if status == 201:
                into.append(json.loads(body)["id"])

        return on_response

    try:
        await http_ready(port, served)
        users = await create_users(port, users_count, receiver.url)
        await _load(port, served, lambda i: reminder_request(users, i), WARM_UP_S, collect(warm))
        meter = CpuMeter(served.pid, server)
        cpu = meter.read()
        load_start = time.time()
        result = await _load(
            port, served, lambda i: reminder_request(users, i), DURATION_S, collect(created)
        )
        load_end = time.time()
        cpu_per_reminder = CpuMeter.per(len(created), cpu, meter.read(), "cpu_ms_")
        await receiver.wait_delivered(len(warm) + len(created), timeout_s=DELIVERY_WAIT_S)
    finally:
        await served.stop()
        await receiver.close()
    first = {rid: got[0] for rid, got in receiver.deliveries.items()}
    arrived = [first[rid] for rid in created if rid in first]
    return {
        "server": "run",
        "users": users_count,
        "created_per_s": round(len(created) / result.elapsed_s, 1),
        "p50_ms": round(result.percentile_ms(50), 2),
        "p99_ms": round(result.percentile_ms(99), 2),
        "errors": result.answered - len(created) + sum(result.errors.values()),
        "delivered_per_s_during_load": round(
            sum(1 for d in first.values() if load_start <= d.received_s <= load_end)
            / (load_end - load_start),
            1,
        ),
        **_spread("lateness", [d.lateness_s for d in arrived if d.received_s <= load_end]),
        **_spread("after_lateness", [d.lateness_s for d in arrived if d.received_s > load_end]),
        "drain_s": round(max([0.0, *(d.received_s - load_end for d in first.values())]), 2),
        "lost": len(created) - len(arrived),
        "duplicates": sum(1 for got in receiver.deliveries.values() if len(got) > 1),
        "bad_signatures": receiver.bad_signatures,
        **cpu_per_reminder,
    }


def _spread(name: str, lateness_s: list[float]) -> dict[str, float]:
    """`<name>_p50_s`, `_p99_s`, `_max_s` of `lateness_s` (NaN when empty), in seconds."""
    return {
        f"{name}_{label}_s": round(percentile(lateness_s, q), 3) if lateness_s else math.nan
        for label, q in (("p50", 50), ("p99", 99), ("max", 100))
    }


async def _load(
    port: int,
    server: Proc,
    make: Callable[[int], Request],
    duration_s: float,
    on_response: loadgen.OnResponse | None = None,
) -> loadgen.Result:
    """`CONNECTIONS` connections on `port` for `duration_s`; fails when `server` exited."""
    result = await closed_loop(
        "127.0.0.1",
        port,
        make,
        connections=CONNECTIONS,
        duration_s=duration_s,
        on_response=on_response,
    )
    check_running((server,))
    return result


def _bare_request(i: int) -> Request:
    return Request.json("POST", "/bare", {"message": f"bench {i}"})


async def _bare(port: int, server: Proc, meter: CpuMeter) -> tuple[float, Figures]:
    """The bare endpoint's 201 answers per second under the same load for `BARE_DURATION_S`,
    served as `run` serves the app (one process, on uvloop, with its access log), and the CPU
    per request (`meter`: `bare_cpu_ms_app`, `bare_cpu_ms_db`)."""
    cpu = meter.read()
    result = await _load(port, server, _bare_request, BARE_DURATION_S)
    if result.statuses[201] != result.answered or result.errors:
        raise RuntimeError(f"the bare endpoint failed: {result.summary()}")
    answered = result.statuses[201]
    return answered / result.elapsed_s, CpuMeter.per(answered, cpu, meter.read(), "bare_cpu_ms_")
