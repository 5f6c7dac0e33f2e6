"""`GET /metrics`: the queue's metrics in the Prometheus text format (`prometheus-client`).

Protected like the admin endpoints (`jobq.api.admin.admin_only`): `Authorization: Bearer
<JOBQ_ADMIN_TOKEN>` (Prometheus: `authorization: {credentials: ...}` in the scrape config), 404
when no admin token is configured, 401 for a missing or wrong one. Not in the OpenAPI document:
its answer is not JSON.

Every figure comes from the database, so any web process answers for the whole fleet: the
cumulative counts and histograms that every process adds to (`jobq.queue.metrics`), the depth
snapshot, and cheap reads (index probes, `job_running`, `worker`, `pg_stat_*`). A scrape counts
no big table.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import accumulate

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString
from quart import Blueprint, Response, current_app, request
from quart_schema import hide

from jobq import clock, db
from jobq.api.admin import admin_only
from jobq.config import Settings
from jobq.db import read_transaction
from jobq.queue import metrics
from jobq.queue.metrics import Reading

bp = Blueprint("metrics", __name__)

HISTOGRAMS = {
    "pickup_lag": (
        "jobq_job_pickup_lag_seconds",
        "Time from a job's ripe_at to its claim (seconds)",
    ),
    "run_time": ("jobq_job_run_time_seconds", "Run time of one attempt of a job (seconds)"),
}


class ReadingCollector(Collector):
    """The metric families of one `Reading` (see the README's table of metrics)."""

    def __init__(self, reading: Reading) -> None:
        self.reading = reading

    def collect(self) -> Iterator[Metric]:
        r = self.reading
        events = CounterMetricFamily(
            "jobq_jobs",
            "Job events per queue and job type, summed over every process: enqueued, started"
            " (claimed), succeeded, retried, failed (dead letter), cancelled, snoozed",
            labels=["queue", "job_type", "event"],
        )
        for row in r.counters:
            events.add_metric([row["queue"], row["job_type"], row["event"]], row["count"])
        yield events

        for metric, (name, doc) in HISTOGRAMS.items():
            family = HistogramMetricFamily(name, doc, labels=["queue", "job_type"])
            for row in r.histograms:
                if row["metric"] != metric:
                    continue
                bounds = [*map(floatToGoString, row["bounds"]), "+Inf"]
                cumulative = list(accumulate(row["buckets"]))
                family.add_metric(
                    [row["queue"], row["job_type"]],
                    list(zip(bounds, cumulative, strict=True)),
                    sum_value=row["sum"],
                )
            yield family

        depth = GaugeMetricFamily(
            "jobq_queue_jobs",
            "Queued jobs per queue, ripe or scheduled (later), as of the last depth snapshot",
            labels=["queue", "state"],
        )
        held = GaugeMetricFamily(
            "jobq_queue_jobs_held",
            "Ripe jobs that the queue's concurrency limits hold back (last depth snapshot)",
            labels=["queue"],
        )
        snapshot_age = GaugeMetricFamily(
            "jobq_queue_snapshot_age_seconds",
            "Age of the depth snapshot of jobq_queue_jobs and jobq_queue_jobs_held",
            labels=["queue"],
        )
        oldest = GaugeMetricFamily(
            "jobq_queue_oldest_ripe_age_seconds",
            "How long the oldest ripe job of the queue has been ripe (0: none)",
            labels=["queue"],
        )
        paused = GaugeMetricFamily(
            "jobq_queue_paused", "1 when the queue is paused, else 0", labels=["queue"]
        )
        for q in r.queues:
            name = q["queue"]
            if q["taken_at"] is not None:
                depth.add_metric([name, "ripe"], q["ripe"])
                depth.add_metric([name, "scheduled"], q["scheduled"])
                held.add_metric([name], q["held"])
                snapshot_age.add_metric([name], (r.now - q["taken_at"]).total_seconds())
            oldest.add_metric([name], max(0.0, q["oldest_ripe_s"] or 0.0))
            paused.add_metric([name], 1 if q["paused"] else 0)
        yield from (depth, held, snapshot_age, oldest, paused)

        running = GaugeMetricFamily(
            "jobq_jobs_running",
            "Jobs running now (claimed, outcome not recorded yet) per queue and job type",
            labels=["queue", "job_type"],
        )
        now_running = {(row["queue"], row["job_type"]): row["running"] for row in r.running}
        known = {(row["queue"], row["job_type"]) for row in r.counters} | set(now_running)
        for queue, job_type in sorted(known):
            running.add_metric([queue, job_type], now_running.get((queue, job_type), 0))
        yield running

        yield GaugeMetricFamily(
            "jobq_workers_alive", "Worker processes alive (as the rescue judges)", r.workers_alive
        )
        yield GaugeMetricFamily(
            "jobq_jobs_waiting",
            "Jobs waiting for other jobs (workflows, batches, sequences) to end",
            r.flows["waiting"],
        )
        yield GaugeMetricFamily(
            "jobq_workflows_open",
            "Workflows and batches with a job not ended (as of the pruner's last round)",
            r.flows["open_workflows"],
        )
        horizon = r.vacuum["oldest_transaction_s"]
        yield GaugeMetricFamily(
            "jobq_vacuum_horizon_age_seconds",
            "Age of the oldest transaction open in the database: vacuum removes no row deleted"
            " after it began (0: none)",
            horizon or 0.0,
        )
        dead_tuples = GaugeMetricFamily(
            "jobq_table_dead_tuples",
            "Dead tuples of the queue tables (pg_stat_user_tables)",
            labels=["table"],
        )
        live_tuples = GaugeMetricFamily(
            "jobq_table_live_tuples",
            "Live tuples of the queue tables (pg_stat_user_tables, an estimate)",
            labels=["table"],
        )
        for table in r.vacuum["tables"]:
            dead_tuples.add_metric([table["table"]], table["n_dead_tup"])
            live_tuples.add_metric([table["table"]], table["n_live_tup"])
        yield from (dead_tuples, live_tuples)


@bp.get("/metrics")
@hide
@admin_only
@read_transaction
async def scrape() -> Response:
    """The metrics in the Prometheus text format (0.0.4), or OpenMetrics when the scraper's
    `Accept` asks for it (prometheus-client's negotiation)."""
    settings: Settings = current_app.extensions["jobq.settings"]
    reading = await metrics.read(
        db.conn(), now=clock.now(), heartbeat_grace=settings.heartbeat_grace
    )
    encode, content_type = choose_encoder(request.headers.get("Accept", ""))
    return Response(encode(ReadingCollector(reading)), status=200, content_type=content_type)
