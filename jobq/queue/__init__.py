"""The queue engine: enqueue, claim, run, retry with backoff, dead letter, rescue, stop."""

from jobq.errors import DontRetry
from jobq.queue.flow import (
    Dependencies,
    Workflow,
    dependencies,
    enqueue_batch,
    enqueue_in_sequence,
    enqueue_workflow,
)
from jobq.queue.model import ALLOW_DUPLICATES, ClaimedJob, Enqueued, Job, JobContext, Unique
from jobq.queue.progress import report_progress, report_progress_from_thread
from jobq.queue.registry import (
    Handler,
    QueueSpec,
    Rate,
    Registry,
    declare_queue,
    handler,
    periodic,
    registry,
)
from jobq.queue.store import enqueue, enqueue_columns, enqueue_many, enqueued
from jobq.queue.worker import Worker

__all__ = [
    "ALLOW_DUPLICATES",
    "ClaimedJob",
    "Dependencies",
    "DontRetry",
    "Enqueued",
    "Handler",
    "Job",
    "JobContext",
    "QueueSpec",
    "Rate",
    "Registry",
    "Unique",
    "Worker",
    "Workflow",
    "declare_queue",
    "dependencies",
    "enqueue",
    "enqueue_batch",
    "enqueue_columns",
    "enqueue_in_sequence",
    "enqueue_many",
    "enqueue_workflow",
    "enqueued",
    "handler",
    "periodic",
    "registry",
    "report_progress",
    "report_progress_from_thread",
]
