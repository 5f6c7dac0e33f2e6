"""The queue's hot statements are served by indexes (read from their EXPLAIN plans)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from datetime import datetime, timedelta

import pytest

from jobq import clock, db
from jobq.db import Connection
from jobq.queue import sql
from jobq.queue.sql import Query
from tests.toolkit.database import fresh_database

NUM_JOBS = 5000


@pytest.fixture
async def filled(conn: Connection) -> Connection:
    """`conn` over a job table of a few thousand rows (priorities and times spread), analysed."""
    now = clock.now()
    await conn.execute(
        """
        INSERT INTO job (job_type, arguments, ripe_at, priority, max_retries, created_at)
        SELECT 'bulk.t' || (i % 7), jsonb_build_object('i', i),
               $1::timestamptz + (i % 400 - 200) * interval '1 minute', (i % 5)::smallint, 5, $1
        FROM generate_series(1, $2::int) AS i
        """,
        now,
        NUM_JOBS,
    )
    await conn.execute("ANALYZE job")
    return conn


async def plan(conn: Connection, statement: Query, **values: object) -> str:
    rows = await conn.fetch("EXPLAIN " + statement.text, *statement.args(**values))
    return "\n".join(r[0] for r in rows)


def outcomes(tokens: list[int], now: datetime) -> dict[str, object]:
    """`sql._RECORD`'s parameters: complete, re-queue and bury a third of `tokens` each."""
    done, failed, buried = tokens[0::3], tokens[1::3], tokens[2::3]
    return {
        "completed": done,
        "results": [None] * len(done),
        "retain": True,
        "failed": failed,
        "failed_ripe_ats": [now] * len(failed),
        "failed_errors": ["boom"] * len(failed),
        "failed_charges": [1] * len(failed),
        "failed_tracebacks": [None] * len(failed),
        "buried": buried,
        "buried_errors": ["dead"] * len(buried),
        "buried_tracebacks": [None] * len(buried),
        "now": now,
    }


def claim_args(tokens: list[int], now: datetime) -> dict[str, object]:
    """The parameters of `job_claim` that record `tokens` as succeeded and claim up to 10 jobs."""
    return {
        "completed": tokens,
        "results": [None] * len(tokens),
        "retain": True,
        "now": now,
        "queues": ["default"],
        "slots": [10],
        "worker_id": 1,
        "lease_expires_at": now + timedelta(seconds=30),
    }


CLAIMS = ["job_claim", "job_claim_unlimited"]


@pytest.mark.parametrize("plan_cache_mode", ["auto", "force_generic_plan"])
@pytest.mark.parametrize("statement", CLAIMS)
async def test_claim_uses_the_claim_index(
    filled: Connection, plan_cache_mode: str, statement: str
) -> None:
    # workers claim with a generic plan (jobq.queue.worker), so that plan is checked too
    await filled.execute(f"SET plan_cache_mode = {plan_cache_mode}")
    text = await plan(filled, getattr(sql, statement), **claim_args([], clock.now()))
    assert re.search(r"Index Scan using job_claim_idx on job", text), text
    # the index gives the order: no sort of the ripe jobs (the only sort is of the claimed
    # jobs' starts, for the rate windows of limited queues, never run without one)
    assert not re.search(r"Sort Key: .*(priority|ripe_at)", text), text
    assert await filled.fetchval("SELECT count(*) FROM job") == NUM_JOBS  # EXPLAIN ran nothing


async def running(conn: Connection) -> list[int]:
    """Claim 3,000 of the filled jobs (so `job_running` is big enough for a plan to matter)."""
    now = clock.now()
    row = await sql.job_claim.fetchrow(conn, **{**claim_args([], now), "slots": [3000]})
    await conn.execute("ANALYZE job_running")
    return [job["token"] for job in row["jobs"]]


@pytest.mark.parametrize("plan_cache_mode", ["auto", "force_generic_plan"])
@pytest.mark.parametrize("statement", ["job_record", *CLAIMS])
async def test_acks_find_their_rows_by_the_token_index(
    filled: Connection, statement: str, plan_cache_mode: str
) -> None:
    tokens = await running(filled)
    await filled.execute(f"SET plan_cache_mode = {plan_cache_mode}")
    now = clock.now()
    args = outcomes(tokens[:30], now) if statement == "job_record" else claim_args(tokens[:30], now)
    text = await plan(filled, getattr(sql, statement), **args)
    # completed (and failed and buried) each find their rows by token, never by a scan
    lookups = 1 if statement in CLAIMS else 3
    found = re.findall(r"Index Scan using job_running_token_key on job_running", text)
    assert len(found) >= lookups, text
    assert not re.search(r"Seq Scan on job_running\b", text), text
    assert await filled.fetchval("SELECT count(*) FROM job_running") == len(tokens)


async def test_dedup_lookup_uses_the_md5_index(filled: Connection) -> None:
    now = clock.now()
    text = await plan(
        filled,
        sql.job_enqueue,
        job_type="bulk.t1",
        arguments={"i": 1},
        ripe_at=now,
        priority=0,
        max_retries=5,
        now=now,
        queue="default",
        concurrency_key=None,
        unique_mode="queued",
        unique_key=None,
    )
    assert "Conflict Arbiter Indexes: job_md5_key" in text, text
    # the duplicate's lookup (not only the arbiter) is an index scan
    assert re.search(r"Index (Only )?Scan using job_md5_key on job", text), text
    assert not re.search(r"Seq Scan on job\b", text), text


async def test_the_check_finds_jobs_past_their_last_attempt_by_the_partial_index(
    filled: Connection,
) -> None:
    """`python -m jobq check` over ten million queued jobs: the attempts invariant reads the
    index of the jobs that break it (empty while it holds), never `job` itself."""
    text = await plan(filled, sql.check_attempts, max_sample=20)
    assert re.search(r"Index (Only )?Scan using job_over_attempts_idx on job", text), text
    assert not re.search(r"Seq Scan on job\b", text), text


async def test_next_ripe_at_uses_an_index(filled: Connection) -> None:
    text = await plan(filled, sql.job_next_ripe_at, now=clock.now(), queues=["default"])
    assert re.search(r"Index (Only )?Scan using job_claim_idx on job", text), text
    assert not re.search(r"Seq Scan on job\b", text), text


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
async def test_a_search_by_state_reads_no_table_that_cannot_hold_it(
    filled: Connection, mode: str
) -> None:
    """`job_list` for failed jobs never walks `job` or `job_done`, whatever their size: a
    custom plan leaves them out, a generic one gates their scans with a one-time filter on the
    parameter, and they never run."""
    assert sql.job_list.params == (
        *("now", "after", "queue", "job_type", "arguments", "state", "limit"),
    )
    await filled.execute(f"SET plan_cache_mode = {mode}")
    await filled.execute(
        "PREPARE search (timestamptz, bigint, text, text, jsonb, text, int) AS " + sql.job_list.text
    )
    rows = await filled.fetch(
        "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF)"
        " EXECUTE search (now(), NULL, NULL, NULL, NULL, 'failed', 50)"
    )
    await filled.execute("DEALLOCATE search; RESET plan_cache_mode")
    text = "\n".join(r[0] for r in rows)
    scans = [line for line in text.splitlines() if re.search(r" on job(_done\w*)? ", line)]
    if mode == "force_generic_plan":
        assert scans, text  # there, and gated
    assert all("never executed" in line for line in scans), text
    assert "on job_dead" in text


SCHEDULED_LATER = 300_000
"""The jobs scheduled for next year behind the 3 ripe ones (issue 12's large queue)."""


@contextlib.asynccontextmanager
async def _seeded_database(
    admin_dsn: str, name: str, insert: str, count: int
) -> AsyncIterator[str]:
    """A database of its own (the reset before each test empties the session's), its `job`
    filled by `insert` (parameters: now, `count`), vacuumed and analysed; yields its DSN.
    The indexes of `job` but its primary key are made again after the insert, from their own
    definitions, as a bulk load does: one sort each rather than a random insert per row into
    the md5 index (several times faster at these sizes)."""
    async with fresh_database(admin_dsn, name) as dsn:
        conn = await db.connect(dsn)
        try:
            indexes = await conn.fetch(
                "SELECT indexrelid::regclass::text AS name, pg_get_indexdef(indexrelid) AS made"
                " FROM pg_index WHERE indrelid = 'job'::regclass AND NOT indisprimary"
            )
            for index in indexes:
                await conn.execute(f"DROP INDEX {index['name']}")
            await conn.execute(insert, clock.now(), count)
            for index in indexes:
                await conn.execute(index["made"])
            await conn.execute("VACUUM ANALYZE job")
        finally:
            await conn.close()
        yield dsn


@pytest.fixture(scope="module")
async def scheduled_later_dsn(admin_dsn: str) -> AsyncIterator[str]:
    """The DSN of a database with 3 jobs ripe, one per priority, and `SCHEDULED_LATER`
    scheduled for next year: seeded once for the variants of the test below, whose claims and
    limits roll back."""
    insert = """
        INSERT INTO job (job_type, arguments, ripe_at, priority, max_retries, created_at)
        SELECT 'bulk', jsonb_build_object('i', i),
               CASE WHEN i <= 3 THEN $1::timestamptz - interval '1 minute'
                    ELSE $1::timestamptz + interval '365 days' + i * interval '1 second'
               END,
               (i % 3)::smallint, 5, $1
        FROM generate_series(1, $2::int) AS i
    """
    async with _seeded_database(admin_dsn, "jobq_later", insert, 3 + SCHEDULED_LATER) as dsn:
        yield dsn


@pytest.fixture
async def scheduled_later(scheduled_later_dsn: str) -> AsyncIterator[Connection]:
    """A connection of its own to the database of `scheduled_later_dsn`."""
    conn = await db.connect(scheduled_later_dsn)
    yield conn
    await conn.close()


@pytest.mark.xdist_group("explain_scheduled_later")  # one worker seeds the database, once
@pytest.mark.parametrize(
    ("plan_cache_mode", "limited", "statement"),
    [
        ("auto", False, "job_claim"),
        ("force_generic_plan", False, "job_claim"),
        ("force_generic_plan", True, "job_claim"),
        ("auto", False, "job_claim_unlimited"),
        ("force_generic_plan", False, "job_claim_unlimited"),
    ],
)
async def test_the_claim_never_walks_the_jobs_scheduled_later(
    scheduled_later: Connection, plan_cache_mode: str, limited: bool, statement: str
) -> None:
    """Fewer jobs ripe than free slots, behind 300,000 scheduled for next year (issue 12's
    large queue): the claim reads the index around the ripe jobs of each priority, not the
    scheduled ones (a plain range scan of the line reads every leaf page of the index). The
    same for a queue with limits that do not bind, whose turn (`job_claim_turns`) walks its
    line the same way (`job_line`)."""
    conn = scheduled_later
    now = clock.now()
    index_pages = await conn.fetchval("SELECT pg_relation_size('job_claim_idx') / 8192")
    await conn.execute(f"SET plan_cache_mode = {plan_cache_mode}")
    claim = getattr(sql, statement)
    types, values = _claim_literals(claim, now)
    await conn.execute(f"PREPARE claim ({types}) AS {claim.text}")
    for explain in ("", "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) "):
        tx = conn.transaction()  # the first claim plans job_claim_turns's statements: not counted
        await tx.start()
        try:
            if limited:  # every kind of limit, none binding (rolled back with the claim)
                await conn.execute(
                    "UPDATE job_queue SET max_running = 1000, max_running_per_key = 100,"
                    " rate_max_starts = 1000000, rate_period = '1 s',"
                    " key_rate_max_starts = 1000000, key_rate_period = '1 s'"
                    " WHERE name = 'default'"
                )
            rows = await conn.fetch(f"{explain}EXECUTE claim ({values})")
            claimed = await conn.fetchval("SELECT count(*) FROM job_running")
        finally:
            await tx.rollback()
    await conn.execute("DEALLOCATE claim; RESET plan_cache_mode")
    text = "\n".join(r[0] for r in rows)
    assert claimed == 3, text
    assert re.search(r"Index Scan using job_claim_idx on job", text), text
    read = sum(_buffers_of(text, "using job_claim_idx on job"))
    if limited:  # the turn's statements count in the Function Scan
        read += sum(_buffers_of(text, "Function Scan on job_claim_turns"))
    assert 0 < read < index_pages / 4, (read, index_pages, text)


def _claim_literals(claim: Query, now: datetime) -> tuple[str, str]:
    """The parameter types of a PREPARE of `claim`, and the literal values of its EXECUTE
    (which takes no bind parameters): a claim at `now` of up to 16 jobs of queue `default`,
    recording nothing."""
    later = now + timedelta(seconds=30)
    given = {
        "completed": ("bigint[]", "'{}'"),
        "results": ("text[]", "'{}'"),
        "retain": ("boolean", "true"),
        "now": ("timestamptz", f"'{now.isoformat()}'"),
        "queues": ("text[]", "'{default}'"),
        "slots": ("int[]", "'{16}'"),
        "worker_id": ("int", "1"),
        "lease_expires_at": ("timestamptz", f"'{later.isoformat()}'"),
    }
    types = ", ".join(given[name][0] for name in claim.params)
    values = ", ".join(given[name][1] for name in claim.params)
    return types, values


def _buffers_of(text: str, scan: str) -> list[int]:
    """The shared buffers (hit + read) of each plan node of `text` whose line has `scan`."""
    found = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if scan in line:
            for detail in lines[i + 1 :]:
                if "->" in detail:
                    break
                if "Buffers:" in detail:
                    found.append(sum(map(int, re.findall(r"(?:hit|read)=(\d+)", detail))))
                    break
    return found


BACKLOG = 100_000
"""The ripe jobs of the lowest priority behind the 3 of a higher one (`priority_backlog_dsn`)."""


@pytest.fixture(scope="module")
async def priority_backlog_dsn(admin_dsn: str) -> AsyncIterator[str]:
    """The DSN of a database with, in queue `default`, 3 ripe jobs of priority 2 (the oldest)
    and `BACKLOG` ripe jobs of priority 0 behind them: seeded once for the variants of the test
    below, whose claims roll back."""
    insert = """
        INSERT INTO job (job_type, arguments, ripe_at, priority, max_retries, created_at)
        SELECT 'bulk', jsonb_build_object('i', i),
               $1::timestamptz + i * interval '1 millisecond'
               - CASE WHEN i <= 3 THEN interval '2 hours' ELSE interval '1 hour' END,
               CASE WHEN i <= 3 THEN 2 ELSE 0 END, 5, $1
        FROM generate_series(1, $2::int) AS i
    """
    async with _seeded_database(admin_dsn, "jobq_backlog", insert, 3 + BACKLOG) as dsn:
        yield dsn


@pytest.fixture
async def priority_backlog(priority_backlog_dsn: str) -> AsyncIterator[Connection]:
    """A connection of its own to the database of `priority_backlog_dsn`."""
    conn = await db.connect(priority_backlog_dsn)
    yield conn
    await conn.close()


@pytest.mark.xdist_group("explain_priority_backlog")  # one worker seeds the database, once
@pytest.mark.parametrize("plan_cache_mode", ["auto", "force_generic_plan"])
@pytest.mark.parametrize("statement", [*CLAIMS, "job_line"])
async def test_the_claim_never_walks_the_ripe_jobs_of_other_priorities(
    priority_backlog: Connection, plan_cache_mode: str, statement: str
) -> None:
    """Fewer jobs of the highest priority than free slots, ahead of a backlog of a lower one:
    the claim takes the 3, then the first 13 of the backlog, and reads the index around them;
    so does the line that a turn of a queue with limits reads (`job_line`, which the turn runs
    with a generic plan). Each priority's jobs can only be read from `job_claim_idx`, whose
    order is the line's: `job` has no index by `(queue, ripe_at)`. With one, the planner may
    serve the same scan from it (at this size, by these statistics, it does), stepping over
    every ripe job of the other priorities at every claim that finds a priority short of its
    free slots."""
    conn = priority_backlog
    now = clock.now()
    index_pages = await conn.fetchval("SELECT pg_relation_size('job_claim_idx') / 8192")
    by_time = await conn.fetch(
        "SELECT indexrelid::regclass::text FROM pg_index AS i"
        " JOIN pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]"
        " JOIN pg_attribute AS b ON b.attrelid = i.indrelid AND b.attnum = i.indkey[1]"
        " WHERE i.indrelid = 'job'::regclass AND a.attname = 'queue' AND b.attname = 'ripe_at'"
    )
    assert by_time == [], "an index of job by (queue, ripe_at)"
    await conn.execute(f"SET plan_cache_mode = {plan_cache_mode}")
    if statement == "job_line":
        text = "SELECT array_agg(priority) FROM job_line($1, $2, $3)"
        params = "text, timestamptz, int"
        values = f"'default', '{now.isoformat()}', 16"
        scan = r"Function Scan on job_line"
    else:
        claim = getattr(sql, statement)
        text = claim.text
        params, values = _claim_literals(claim, now)
        scan = r"Scan using (?!job_pkey)\w+ on job( |$)"  # not the moves' lookups by id
    await conn.execute(f"PREPARE claim ({params}) AS {text}")
    for explain in ("", "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) "):
        tx = conn.transaction()
        await tx.start()
        try:
            rows = await conn.fetch(f"{explain}EXECUTE claim ({values})")
            if not explain:  # the priorities of the jobs taken, in the order taken
                priorities = (
                    rows[0][0]
                    if statement == "job_line"
                    else await conn.fetchval(
                        "SELECT array_agg(priority ORDER BY token) FROM job_running"
                    )
                )
        finally:
            await tx.rollback()
    await conn.execute("DEALLOCATE claim; RESET plan_cache_mode")
    plan_text = "\n".join(r[0] for r in rows)
    assert priorities == [2] * 3 + [0] * 13, plan_text
    # the walk is inlined into the statement that calls it (a Function Scan would plan it anew)
    assert "Function Scan on job_priorities" not in plan_text, plan_text
    read = sum(_buffers_of_scans(plan_text, scan))
    assert 0 < read < index_pages / 4, (read, index_pages, plan_text)


def _buffers_of_scans(text: str, scan: str) -> list[int]:
    """`_buffers_of` for the plan nodes whose line matches the regular expression `scan`."""
    found = []
    for line in text.splitlines():
        match = re.search(scan, line)
        if match:
            found.extend(_buffers_of(text, line))
    return found
