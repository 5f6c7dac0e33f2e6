"""Fair delivery through `make run`'s supervisor: eight users behind slow webhooks cannot hold
the delivery slots that the others' reminders need.

`python -m jobq run` (web and worker processes, one of each per CPU: 32 delivery slots on 2
cores) runs with the default shares (2 deliveries at once per user, 4 per webhook address) and
deadline (15 s an attempt). Eight slow users (`tests.toolkit.slow_hook`: four whose webhooks
are one server on 127.0.0.2, under four spellings of it (four host names to a
per-name limit), and four on an address each, two that
trickle their answers and two that answer nothing) have `SLOW_REMINDERS` reminders each,
due at once. Once they hold their shares, `OTHER_USERS` other users, behind a fast receiver, get
reminders due over `WINDOW_S`. Without the shares the slow attempts took every slot until their
deadline, and the others' reminders waited that long.

The checks: the slow users hold no more than their shares (4 attempts at the shared address,
2 at each other, counted by the servers until the first attempt reaches its deadline); every
other user's reminder is delivered, each correctly signed, its lateness (arrival minus due
time) p99 under `MAX_LATENESS_S`. One JSON line of figures
(`scenario: delivery_fairness`) is printed and appended to `.chaos/results.jsonl`.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.loadgen import percentile
from jobq.db import Database
from tests.chaos.helpers import emit
from tests.toolkit.procs import WEBHOOK_SECRET, eventually, free_port, http_ready, spawn
from tests.toolkit.receiver import WebhookReceiver
from tests.toolkit.slow_hook import SlowHook, slow_hooks

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]

SLOW_REMINDERS = 10
OTHER_USERS = 4
OTHER_REMINDERS = 5
WINDOW_S = 10.0
MAX_LATENESS_S = 2.0
"""The bound on the others' p99 lateness: the unfair case is the attempts' deadline (15 s)."""


async def create_user(http: httpx.AsyncClient, name: str, url: str) -> tuple[int, str]:
    response = await http.post(
        "/users", json={"name": name, "email": f"{name}@example.com", "webhook_url": url}
    )
    assert response.status_code == 201, response.text
    user = response.json()
    return user["id"], user["api_key"]


async def remind(
    http: httpx.AsyncClient, user: tuple[int, str], in_s: float
) -> tuple[int, datetime]:
    """A reminder for `user` due `in_s` seconds from now: its id and due time."""
    response = await http.post(
        f"/users/{user[0]}/reminders",
        json={"message": "m", "remind_in_seconds": in_s},
        headers={"Authorization": f"Bearer {user[1]}"},
    )
    assert response.status_code == 201, response.text
    reminder = response.json()
    return reminder["id"], datetime.fromisoformat(reminder["remind_at"])


async def test_slow_webhooks_hold_their_shares_and_the_others_are_on_time(
    database: Database, tmp_path: Path
) -> None:
    shared = SlowHook("127.0.0.2")
    alone = [SlowHook(f"127.0.0.{3 + i}", trickle=i % 2 == 0) for i in range(4)]
    receiver = WebhookReceiver(secret=WEBHOOK_SECRET)
    await receiver.start()
    port = free_port()
    proc = spawn(
        "run",
        "run",
        database_url=database.dsn,
        log_dir=tmp_path,
        env={
            "JOBQ_HTTP_HOST": "127.0.0.1",
            "JOBQ_HTTP_PORT": str(port),
            "JOBQ_WEBHOOK_ALLOW_PRIVATE": "true",  # every webhook is on a loopback address
            "JOBQ_RATE_LIMIT_PER_S": "0",
            "JOBQ_SIGNUP_RATE_PER_HOUR": "0",  # nine users sign up from one address
            "JOBQ_LOG_LEVEL": "WARNING",
        },
    )
    try:
        async with (
            slow_hooks(shared, *alone),
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http,
        ):
            await http_ready(port, proc)
            spellings = ["127.0.0.2", "[::ffff:127.0.0.2]", "[::ffff:7f00:2]", "[0::ffff:7f00:2]"]
            urls = [f"http://{spellings[i]}:{shared.port}/hook" for i in range(4)]
            urls += [f"http://{h.address}:{h.port}/hook" for h in alone]
            slow = [await create_user(http, f"slow{i}", url) for i, url in enumerate(urls)]
            others = [
                await create_user(http, f"other{i}", receiver.url) for i in range(OTHER_USERS)
            ]
            for user in slow:
                for _ in range(SLOW_REMINDERS):
                    await remind(http, user, 2)

            def held() -> bool:
                return shared.in_flight == 4 and all(h.in_flight == 2 for h in alone)

            await eventually(held, within=20, what="the slow users' shares", running=(proc,))
            count = OTHER_USERS * OTHER_REMINDERS
            due_at: dict[int, datetime] = {}
            for n in range(count):
                reminder_id, at = await remind(
                    http, others[n % OTHER_USERS], 1 + WINDOW_S * n / count
                )
                due_at[reminder_id] = at
            deadline = time.monotonic() + WINDOW_S + 30
            while receiver.delivered < count and time.monotonic() < deadline:
                await receiver.wait_delivered(count, timeout_s=1)
            peaks = [shared.first_peak, *(h.first_peak for h in alone)]
            in_flight = [shared.in_flight, *(h.in_flight for h in alone)]
    finally:
        code = await proc.stop()
        await receiver.close()
    lateness = [
        (datetime.fromtimestamp(deliveries[0].received_s, UTC) - due_at[rid]).total_seconds()
        for rid, deliveries in receiver.deliveries.items()
        if rid in due_at
    ]
    lost = count - len(lateness)
    figures: dict[str, Any] = {
        "scenario": "delivery_fairness",
        "lost": lost,
        "slow_users": len(slow),
        "other_users": OTHER_USERS,
        "other_reminders": count,
        "other_user_lateness_p50_s": round(percentile(lateness, 50), 3) if lateness else None,
        "other_user_lateness_p99_s": round(percentile(lateness, 99), 3) if lateness else None,
        "other_user_lateness_max_s": round(max(lateness), 3) if lateness else None,
        "slow_in_flight_peaks": peaks,
        "slow_in_flight_at_end": in_flight,
        "bad_signatures": receiver.bad_signatures,
    }
    emit(figures)
    assert lost == 0
    assert receiver.bad_signatures == 0
    assert peaks == [4, 2, 2, 2, 2]  # the shares held, never more
    assert percentile(lateness, 99) < MAX_LATENESS_S
    assert code == 0
