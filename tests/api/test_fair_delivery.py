"""Fair delivery (`jobq.domain.shares`): a user's share, an address's share whatever its names,
and a deadline per attempt that a slow server cannot stretch, against real slow HTTP servers
on loopback addresses (127.0.0.2, 127.0.0.3, ...: Linux answers on all of 127.0.0.0/8) and
workers running as the service runs them.

Names are answered by the test resolver (`tests.api.conftest.dns`): four names on one address
count as one address.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta

import pytest
from quart.typing import TestClientProtocol as Client

from jobq import clock, db, jobs, statements
from jobq.config import Settings
from jobq.db import Connection, Database
from jobq.domain import shares, webhooks
from jobq.domain.webhooks import webhook_client
from jobq.queue import Worker, registry
from tests.api.conftest import Answers
from tests.api.helpers import act_as, create_reminder, create_user
from tests.conftest import make_settings
from tests.toolkit.procs import eventually
from tests.toolkit.receiver import WebhookReceiver
from tests.toolkit.slow_hook import SlowHook, slow_hooks

MakeWorker = Callable[..., Awaitable[Worker]]

TOTAL_TIMEOUT_S = 8.0
"""The deadline of an attempt in these tests: the unfair case would make the other user wait
about this long."""


@contextlib.asynccontextmanager
async def running_workers(
    make_worker: MakeWorker, settings: Settings, count: int
) -> AsyncIterator[list[Worker]]:
    """`count` workers with the app's handlers and queues, each claiming on its own
    connection, in `run(stop)` until the block ends."""
    jobs.declare_queues(settings)
    stop = asyncio.Event()
    async with webhook_client(settings) as http:
        workers = [
            await make_worker(registry, state={"settings": settings, "http": http})
            for _ in range(count)
        ]
        tasks = [asyncio.create_task(w.run(stop)) for w in workers]
        try:
            yield workers
        finally:
            stop.set()
            for worker in workers:
                await worker.abort()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


@pytest.fixture
def settings(database_url: str) -> Settings:
    """Two workers of 16 slots (`make run` on 2 cores: 32), the default shares (2 deliveries at
    once per user, 4 per address), reads that could wait longer than the attempt's deadline."""
    return make_settings(
        database_url,
        webhook_timeout=timedelta(seconds=30),
        webhook_total_timeout=timedelta(seconds=TOTAL_TIMEOUT_S),
    )


async def test_eight_slow_users_hold_their_shares_and_another_is_delivered_on_time(
    client: Client,
    dns: Answers,
    make_worker: MakeWorker,
    receiver: WebhookReceiver,
    settings: Settings,
) -> None:
    """Eight users behind slow webhooks, each with 3 reminders due: four behind four names of
    one address (127.0.0.2), four behind an address each (two that trickle their answer, two
    that answer nothing). They hold what they may: 4 attempts at the shared address, 2 for
    each of the others (12 of 32 slots), never more, and every one of them is still in flight
    when another user's reminder, due 0.5 s later, is delivered on time. Without the shares
    the slow attempts took every slot until their deadline (8 s)."""
    assert settings.reminder_user_max_running == 2
    assert settings.reminder_host_max_running == 4
    shared = SlowHook("127.0.0.2")
    alone = [SlowHook(f"127.0.0.{3 + i}", trickle=i % 2 == 0) for i in range(4)]
    async with slow_hooks(shared, *alone):
        urls = []
        for i in range(4):
            dns[f"slow-{i}.test"] = ["127.0.0.2"]
            urls.append(f"http://slow-{i}.test:{shared.port}/hook")
        urls += [f"http://{hook.address}:{hook.port}/hook" for hook in alone]
        for i, url in enumerate(urls):  # each due 5 s after it is made: after the others too
            user = await create_user(client, f"Slow {i}", f"slow{i}@example.com", webhook_url=url)
            for n in range(3):
                await create_reminder(client, user["id"], message=f"slow {n}", remind_in_seconds=5)
        other = await create_user(client, "Other", "other@example.com", webhook_url=receiver.url)

        async with running_workers(make_worker, settings, 2):

            def held() -> bool:
                return shared.in_flight == 4 and all(h.in_flight == 2 for h in alone)

            await eventually(held, within=15, what="the slow users' shares")
            act_as(client, other)
            # Due 0.5 s after the server reads its clock: a slow request cannot make it past.
            made = await create_reminder(
                client, other["id"], message="on time", remind_in_seconds=0.5
            )
            remind_at = datetime.fromisoformat(made["remind_at"])
            assert await receiver.wait_delivered(1, timeout_s=TOTAL_TIMEOUT_S * 2)
            [[delivery]] = receiver.deliveries.values()
            arrived = datetime.fromtimestamp(delivery.received_s, UTC)
            in_flight = [shared.in_flight, *(h.in_flight for h in alone)]
            ended = shared.ended + sum(h.ended for h in alone)

    lateness_s = (arrived - remind_at).total_seconds()
    print(f"the other user's lateness: {lateness_s * 1000:.0f} ms; slow in flight: {in_flight}")
    assert ended == 0  # no slow attempt had to end for it: it never waited on one
    assert in_flight == [4, 2, 2, 2, 2]
    assert [shared.peak, *(h.peak for h in alone)] == [4, 2, 2, 2, 2]
    assert 0 <= lateness_s < TOTAL_TIMEOUT_S / 4


async def test_an_attempt_ends_at_its_deadline_however_the_server_trickles(
    client: Client, make_worker: MakeWorker, database_url: str, conn: Connection
) -> None:
    """A server that sends a byte every 0.2 s never lets the read timeout (1 s) fire: the
    attempt's deadline (1.5 s) ends it, and the delivery is retried later."""
    short = make_settings(
        database_url,
        webhook_timeout=timedelta(seconds=1),
        webhook_total_timeout=timedelta(seconds=1.5),
    )
    hook = SlowHook("127.0.0.2", every_s=0.2)
    async with slow_hooks(hook):
        user = await create_user(client, webhook_url=f"http://127.0.0.2:{hook.port}/hook")
        reminder = await create_reminder(client, user["id"], message="m", remind_in_seconds=0.01)
        await asyncio.sleep(0.05)
        jobs.declare_queues(short)
        async with webhook_client(short) as http:
            worker = await make_worker(registry, state={"settings": short, "http": http})
            started = time.monotonic()
            assert await worker.run_once() == 1
            await worker.wait_idle()
            elapsed_s = time.monotonic() - started
    assert hook.ended == 1
    assert 1.5 <= elapsed_s < 10  # the trickle alone would go on for as long as it is read
    job = await conn.fetchrow(
        "SELECT attempts, last_error FROM job WHERE id = $1", reminder["job_id"]
    )
    assert job is not None
    assert job["attempts"] == 1
    assert job["last_error"] == "WebhookFailed: webhook at 127.0.0.2: no answer within 1.5 s"


async def test_an_address_share_is_exact_under_concurrent_takes(
    database: Database, settings: Settings
) -> None:
    """Twenty attempts take a hold on one address at once, each on a connection of its own:
    exactly `reminder_host_max_running` (4) get one; the others are told to wait. A hold ends
    at its release, or at its deadline (a worker that died); starts count within the rate
    window (`reminder_host_rate` per period)."""
    now = clock.now()
    taken = await asyncio.gather(*(shares.take("203.0.113.7", now, settings) for _ in range(20)))
    holds = [t for t in taken if isinstance(t, int)]
    assert len(holds) == 4
    waits = [t for t in taken if not isinstance(t, int)]
    assert all(shares.MAX_WAIT <= t <= shares.MAX_WAIT * 1.5 for t in waits), waits
    assert isinstance(await shares.take("203.0.113.8", now, settings), int)  # another address

    async with db.transaction():
        await shares.release(holds[0])
    assert isinstance(await shares.take("203.0.113.7", now, settings), int)
    assert not isinstance(await shares.take("203.0.113.7", now, settings), int)
    # the holds of a worker that died end at their deadline
    later = now + settings.webhook_total_timeout + shares.HOLD_MARGIN
    assert isinstance(await shares.take("203.0.113.7", later, settings), int)

    rated = make_settings(
        database.dsn, reminder_host_rate=3, reminder_host_rate_period=timedelta(seconds=10)
    )
    for _ in range(3):
        hold = await shares.take("198.51.100.1", now, rated)
        assert isinstance(hold, int)
        async with db.transaction():
            await shares.release(hold)
    wait = await shares.take("198.51.100.1", now + timedelta(seconds=9.9), rated)
    assert isinstance(wait, timedelta)
    assert timedelta(seconds=0.1) <= wait <= timedelta(seconds=0.15)  # the window opens at 10 s
    assert isinstance(await shares.take("198.51.100.1", now + timedelta(seconds=10), rated), int)


async def _take(
    conn: Connection, address: str, now: datetime, *, max_starts: int, period_s: float = 10.0
) -> tuple[int | None, datetime | None]:
    """One take of `address` at `now` (100 at once, `max_starts` per `period_s`), released at
    once: (hold id, retry_at)."""
    row = await statements.webhook_hold_take.fetchrow(
        conn,
        address=address,
        now=now,
        held_until=now + timedelta(seconds=30),
        max_running=100,
        max_starts=max_starts,
        period=timedelta(seconds=period_s),
    )
    if row["hold_id"] is not None:
        await statements.webhook_hold_release.execute(conn, hold_id=row["hold_id"])
    return row["hold_id"], row["retry_at"]


async def _statistic(conn: Connection, query: str) -> int:
    """The figure `query` reads from the statistics views, once this session's own counts are
    flushed to them and its cached snapshot of them dropped."""
    await conn.execute("SELECT pg_stat_force_next_flush(), pg_stat_clear_snapshot()")
    figure: int = await conn.fetchval(query)
    return figure


async def test_an_address_rate_counts_every_start_in_a_full_window_and_a_clock_behind(
    database: Database,
) -> None:
    """1,000 starts a second apart in a window of 1,000 s: the 1,001st is refused until
    the first leaves the window, and the window slides one start at a time. A process whose
    clock is behind takes its start no earlier than the last one: it counts as long as the
    others do."""
    now = datetime(2030, 1, 1, tzinfo=UTC)

    def at(seconds: float) -> datetime:
        return now + timedelta(seconds=seconds)

    async with database.pool.acquire() as conn:

        async def take(seconds: float) -> tuple[int | None, datetime | None]:
            return await _take(conn, "203.0.113.50", at(seconds), max_starts=1000, period_s=1000)

        for i in range(1000):
            assert (await take(i))[0] is not None, i
        assert await take(999.5) == (None, at(1000))  # when the first start leaves the window
        assert (await take(1000))[0] is not None  # the first left the window: one more
        assert (await take(1000))[0] is None

        behind = "203.0.113.51"
        assert (await _take(conn, behind, at(0), max_starts=2))[0] is not None
        # a clock 5 s behind: its start is recorded at the last one's time
        assert (await _take(conn, behind, at(-5), max_starts=2))[0] is not None
        starts = await conn.fetch(
            "SELECT started_at, start_no FROM webhook_start WHERE address = $1 ORDER BY start_no",
            behind,
        )
        assert [tuple(s) for s in starts] == [(at(0), 1), (at(0), 2)]
        assert await _take(conn, behind, at(9), max_starts=2) == (None, at(10))
        assert (await _take(conn, behind, at(10), max_starts=2))[0] is not None


async def test_a_take_reads_as_many_rows_whatever_the_starts_in_its_window(
    database: Database,
) -> None:
    """A take reads the rows it needs (the window's first and last start, the running holds),
    not every start in the window, nor the rows of the holds that ended: its index reads
    (`pg_stat_user_indexes`, flushed by the taking session itself) are the same with 10 and
    1,000 starts and ended holds before it (it read every one of them when the starts were the
    holds' rows, and twice as many with bitmap scans), give or take the entries not yet marked
    dead: the holds' index is by address alone, so it keeps an address's entries in posting
    lists of up to about 220 (an 8 kB page's), and marks a list dead only once every hold in it
    has ended before every snapshot. The margin, 500, allows for a few such lists (a loaded
    machine reads more of them), and is half of what reading every start costs.

    An ended hold's entry is known dead once no snapshot of the database is older than its
    end: a session of the database in a transaction meanwhile (an autovacuum's analyze, a
    backend of an earlier test not gone yet) makes every take read it until one take after
    that marks it. So the takes measured come after no other session holds a snapshot, and
    after one take that marks what ended before."""
    now = datetime(2030, 1, 1, tzinfo=UTC)

    index_reads = (
        "SELECT sum(idx_tup_read) FROM pg_stat_user_indexes"
        " WHERE relname IN ('webhook_hold', 'webhook_start')"
    )

    async def no_other_snapshot(conn: Connection) -> bool:
        others: int = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND backend_xmin IS NOT NULL"
        )
        return others == 0

    async def reads_of_one_take(conn: Connection, address: str, starts: int) -> int:
        for i in range(starts):
            await _take(conn, address, now + timedelta(milliseconds=i), max_starts=10_000)
        await eventually(lambda: no_other_snapshot(conn), within=60, what="no other snapshot")
        await _take(conn, address, now + timedelta(milliseconds=starts), max_starts=10_000)
        before = await _statistic(conn, index_reads)
        await _take(conn, address, now + timedelta(seconds=1), max_starts=10_000)
        return await _statistic(conn, index_reads) - before

    async with database.pool.acquire() as conn:
        few = await reads_of_one_take(conn, "203.0.113.60", 10)
        many = await reads_of_one_take(conn, "203.0.113.61", 1000)
    assert many <= few + 500, (few, many)


async def test_a_take_walks_none_of_the_index_entries_of_the_starts_dropped_before(
    database: Database,
) -> None:
    """A take drops the starts before its window from where the address's rows begin (the last
    start's `kept_from`), so it reads as many pages of `webhook_start`'s index (buffers of
    `pg_statio_user_indexes`, flushed by the taking session itself) after 3,000 starts dropped
    as after 10: the index keeps a dropped start's entry until a vacuum, and a delete from the
    address's first entry walked every one of them."""
    now = datetime(2030, 1, 1, tzinfo=UTC)

    pages_read = (
        "SELECT idx_blks_read + idx_blks_hit FROM pg_statio_user_indexes"
        " WHERE indexrelname = 'webhook_start_pkey'"
    )

    async def pages_of_one_take(conn: Connection, address: str, starts: int) -> int:
        # A start a millisecond, 500 in a window: the entries of those dropped lie to the left
        # of the window's, on pages where no start is inserted any more.
        for i in range(starts):
            await _take(
                conn, address, now + timedelta(milliseconds=i), max_starts=10_000, period_s=0.5
            )
        before = await _statistic(conn, pages_read)
        await _take(
            conn, address, now + timedelta(milliseconds=starts), max_starts=10_000, period_s=0.5
        )
        return await _statistic(conn, pages_read) - before

    async with database.pool.acquire() as conn:
        many = await pages_of_one_take(conn, "203.0.113.63", 3000)
        few = await pages_of_one_take(conn, "203.0.113.62", 10)  # in an index as deep
    assert many <= few + 2, (few, many)


async def test_the_take_refuses_to_run_inside_a_transaction(
    database: Database, settings: Settings
) -> None:
    """The take commits asynchronously (`synchronous_commit` off for its transaction): inside
    another transaction it would turn that one's commit asynchronous too, so it refuses."""
    now = clock.now()
    async with db.transaction() as tx:
        await tx.execute("INSERT INTO users (name, email, created_at) VALUES ('B', 'b@x', now())")
        with pytest.raises(Exception, match="autocommit"):
            await statements.webhook_hold_take.fetchrow(
                tx,
                address="203.0.113.7",
                now=now,
                held_until=now + settings.webhook_total_timeout,
                max_running=4,
                max_starts=20,
                period=timedelta(seconds=1),
            )


def test_an_ipv6_host_shares_by_its_slash_64() -> None:
    one = webhooks.Target("a.test", 443, ("2001:db8:1:2::10",))
    two = webhooks.Target("b.test", 443, ("2001:db8:1:2:ffff::1", "203.0.113.9"))
    assert one.share_key == two.share_key == "2001:db8:1:2::/64"
    assert webhooks.Target("c.test", 80, ("203.0.113.5",)).share_key == "203.0.113.5"
    assert webhooks.Target("d.test", 80, ("::ffff:203.0.113.5",)).share_key == "203.0.113.5"
