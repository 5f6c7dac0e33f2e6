"""The queue engine: enqueue, claim, run, retry with backoff, dead letter, rescue, stop."""

from jobq.errors import DontRetry
from jobq.queue.model import ALLOW_DUPLICATES, ClaimedJob, Enqueued, Job, JobContext, Unique
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
from jobq.queue.store import enqueue, enqueue_many
from jobq.queue.worker import Worker

__all__ = [
    "ALLOW_DUPLICATES",
    "ClaimedJob",
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
    "declare_queue",
    "enqueue",
    "enqueue_many",
    "handler",
    "periodic",
    "registry",
]
