"""`/metrics` scraped over HTTP from real `python -m jobq` processes while jobs flow: every
metric moves as jobs are enqueued, run, retried, buried, snoozed, cancelled, held back and
paused; the counts of two worker processes sum.

The handlers are `tests/proc_metrics_handlers.py`; the test process enqueues their jobs (and
flushes its own counts, as any process does), the served process runs them (or two worker
processes do), and the test reads the exposition with `prometheus_client.parser`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobq.db import Connection, Database
from jobq.queue import Job, enqueue, enqueue_many, metrics
from tests.proc_metrics_handlers import FAIL, OK, QUEUE, SLEEP, SNOOZE, WIDE
from tests.test_processes import WORKER_ENV
from tests.toolkit.procs import Procs, eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

ADMIN_TOKEN = "metrics-test-admin-token"  # noqa: S105 (a test value)
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
ENV = {
    **WORKER_ENV,
    "JOBQ_JOB_MODULES": "tests.proc_metrics_handlers",
    "JOBQ_ADMIN_TOKEN": ADMIN_TOKEN,
    "JOBQ_METRICS_FLUSH_INTERVAL_S": "0.1",
    "JOBQ_METRICS_SNAPSHOT_INTERVAL_S": "0.2",
    "JOBQ_BACKOFF_BASE_S": "0.1",
}
WAIT_S = 30.0

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def sample(samples: Samples, name: str, **labels: str) -> float:
    """The value of sample `name` with exactly `labels` (0 when there is none)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


class Scraper:
    """Scrapes `/metrics` of a served process with the admin token."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http

    async def __call__(self) -> Samples:
        response = await self.http.get("/metrics", headers=ADMIN)
        assert response.status_code == 200, response.text
        assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
        return {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(response.text)
            for s in family.samples
        }

    async def until(
        self, expected: Mapping[tuple[str, frozenset[tuple[str, str]]], float]
    ) -> Samples:
        """Scrape until every sample of `expected` has its value; return the last scrape."""
        last: Samples = {}

        async def reached() -> bool:
            nonlocal last
            last = await self()
            return all(last.get(key, 0.0) == value for key, value in expected.items())

        try:
            await eventually(reached, within=WAIT_S, what="the metrics", every=0.05)
        except AssertionError:
            wrong = {k: (last.get(k, 0.0), v) for k, v in expected.items() if last.get(k) != v}
            raise AssertionError(f"(got, expected): {wrong}") from None
        return last


def key(name: str, **labels: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return (name, frozenset(labels.items()))


def event(job_type: str, name: str, queue: str = QUEUE) -> tuple[str, frozenset[tuple[str, str]]]:
    return key("jobq_jobs_total", queue=queue, job_type=job_type, event=name)


@pytest.fixture
async def scraper(procs: Procs, database: Database, conn: Connection) -> AsyncIterator[Scraper]:
    """A served process (`python -m jobq serve`, with its worker) and its scraper."""
    _, port = await procs.serve("web", {**ENV, "JOBQ_RUN_WORKERS": "true"})
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
        yield Scraper(http)


async def test_every_metric_moves_as_jobs_flow(scraper: Scraper, database: Database) -> None:
    refused = await scraper.http.get("/metrics")
    assert refused.status_code == 401
    assert refused.json()["error"] == "unauthorized"

    # enqueued here (counted after the commit, flushed as any process does), run there
    await enqueue_many(Job(job_type=OK, arguments={"n": n}, queue=QUEUE) for n in (1, 2))
    await enqueue(Job(job_type=FAIL, queue=QUEUE, max_retries=1))
    await enqueue(Job(job_type=SNOOZE, queue=QUEUE))
    later = await enqueue(Job(job_type=OK, arguments={"n": 3}, queue=QUEUE).runs_in(hours=1))
    await metrics.flush(database)
    flowed = await scraper.until(
        {
            event(OK, "enqueued"): 3,
            event(OK, "started"): 2,
            event(OK, "succeeded"): 2,
            event(FAIL, "enqueued"): 1,
            event(FAIL, "started"): 2,
            event(FAIL, "retried"): 1,
            event(FAIL, "failed"): 1,
            event(SNOOZE, "started"): 2,
            event(SNOOZE, "snoozed"): 1,
            event(SNOOZE, "succeeded"): 1,
            key("jobq_job_pickup_lag_seconds_count", queue=QUEUE, job_type=OK): 2,
            key("jobq_job_run_time_seconds_count", queue=QUEUE, job_type=OK): 2,
            key("jobq_job_run_time_seconds_count", queue=QUEUE, job_type=FAIL): 2,
            key("jobq_queue_jobs", queue=QUEUE, state="scheduled"): 1,
            key("jobq_queue_jobs", queue=QUEUE, state="ripe"): 0,
            key("jobq_queue_paused", queue=QUEUE): 0,
            key("jobq_workers_alive"): 1,
        }
    )
    lag = key("jobq_job_pickup_lag_seconds_bucket", queue=QUEUE, job_type=OK, le="+Inf")
    assert flowed[lag] == 2
    assert flowed[key("jobq_job_run_time_seconds_sum", queue=QUEUE, job_type=OK)] >= 0
    assert key("jobq_vacuum_horizon_age_seconds") in flowed
    assert key("jobq_table_dead_tuples", table="job") in flowed
    assert flowed[key("jobq_queue_snapshot_age_seconds", queue=QUEUE)] < WAIT_S

    # a cancel of a scheduled job (through the admin API of the served process)
    cancelled = await scraper.http.post(f"/jobs/{later.id}/cancel", headers=ADMIN)
    assert cancelled.json()["state"] == "cancelled"
    await scraper.until(
        {event(OK, "cancelled"): 1, key("jobq_queue_jobs", queue=QUEUE, state="scheduled"): 0}
    )

    # one running, two held back by the queue's max_running of 1
    sleeps = [
        await enqueue(Job(job_type=SLEEP, arguments={"n": n, "sleep_s": 60}, queue=QUEUE))
        for n in range(3)
    ]
    await metrics.flush(database)
    held = await scraper.until(
        {
            event(SLEEP, "enqueued"): 3,
            event(SLEEP, "started"): 1,
            key("jobq_jobs_running", queue=QUEUE, job_type=SLEEP): 1,
            key("jobq_queue_jobs", queue=QUEUE, state="ripe"): 2,
            key("jobq_queue_jobs_held", queue=QUEUE): 2,
        }
    )
    assert held[key("jobq_queue_oldest_ripe_age_seconds", queue=QUEUE)] > 0

    # paused; then every sleeping job cancelled, the running one too (its handler is cut short)
    assert (await scraper.http.post(f"/queues/{QUEUE}/pause", headers=ADMIN)).status_code == 204
    await scraper.until({key("jobq_queue_paused", queue=QUEUE): 1})
    for job in sleeps:
        answer = await scraper.http.post(f"/jobs/{job.id}/cancel", headers=ADMIN)
        assert answer.status_code == 200, answer.text
    assert (await scraper.http.post(f"/queues/{QUEUE}/resume", headers=ADMIN)).status_code == 204
    done = await scraper.until(
        {
            event(SLEEP, "cancelled"): 3,
            key("jobq_jobs_running", queue=QUEUE, job_type=SLEEP): 0,
            key("jobq_queue_jobs", queue=QUEUE, state="ripe"): 0,
            key("jobq_queue_jobs_held", queue=QUEUE): 0,
            key("jobq_queue_paused", queue=QUEUE): 0,
        }
    )
    # a job cancelled while it ran ends cancelled, and is counted so only
    assert sample(done, "jobq_jobs_total", queue=QUEUE, job_type=SLEEP, event="succeeded") == 0
    assert sample(done, "jobq_jobs_total", queue=QUEUE, job_type=SLEEP, event="started") == 1


async def test_counts_of_two_worker_processes_sum(
    procs: Procs, database: Database, conn: Connection
) -> None:
    """Two worker processes and a web process that runs none: the web process's counts are the
    sum of the workers' own (their final counts, logged when they stop)."""
    env = {**ENV, "JOBQ_MAX_CONCURRENT_JOBS": "2"}
    workers = [await procs.worker(conn, f"worker-{n}", env) for n in range(2)]
    _, port = await procs.serve("web", {**env, "JOBQ_RUN_WORKERS": "false"})
    num_jobs = 12
    await enqueue_many(
        Job(job_type=OK, arguments={"n": n, "sleep_s": 0.2}, queue=WIDE) for n in range(num_jobs)
    )
    await metrics.flush(database)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
        scraped = await Scraper(http).until(
            {
                event(OK, "enqueued", WIDE): num_jobs,
                event(OK, "started", WIDE): num_jobs,
                event(OK, "succeeded", WIDE): num_jobs,
                key("jobq_job_pickup_lag_seconds_count", queue=WIDE, job_type=OK): num_jobs,
                key("jobq_workers_alive"): 2,
            }
        )
    # each handler slept 0.2 s; uvloop's timers run on libuv's clock (whole milliseconds, read
    # at the start of a loop iteration), so a sleep can end up to a millisecond or so early by
    # time.monotonic, which times the run (2.3998 s for 12 once, in a fresh-clone `make test`)
    slept_s = (0.2 - 0.002) * num_jobs
    assert scraped[key("jobq_job_run_time_seconds_sum", queue=WIDE, job_type=OK)] >= slept_s
    for worker in workers:
        assert await worker.stop() == 0
    completed = [worker.final_counts().get("completed", 0) for worker in workers]
    assert sum(completed) == num_jobs
    assert all(completed), f"each worker ran some: {completed}"


async def test_a_graceful_stop_flushes_what_is_left(
    procs: Procs, database: Database, conn: Connection
) -> None:
    """A worker that would flush only every hour: its counts reach the database when it stops
    (SIGTERM)."""
    worker = await procs.worker(conn, "worker", {**ENV, "JOBQ_METRICS_FLUSH_INTERVAL_S": "3600"})
    await enqueue_many(Job(job_type=OK, arguments={"n": n}, queue=WIDE) for n in range(3))
    # this process's count of those enqueues is dropped: the counts checked are the worker's
    metrics.tally.take()

    async def finished() -> bool:
        done: int = await conn.fetchval("SELECT count(*) FROM job_done")
        return done == 3

    await eventually(finished, within=WAIT_S, what="the jobs to finish", running=(worker,))
    assert await conn.fetchval("SELECT count(*) FROM job_counter") == 0
    assert await worker.stop() == 0
    rows = await conn.fetch("SELECT event, count FROM job_counter WHERE job_type = $1", OK)
    assert {r["event"]: r["count"] for r in rows} == {"started": 3, "succeeded": 3}
