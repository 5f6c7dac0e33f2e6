"""Queues with limits for the real-process queue tests (`tests/test_queue_processes.py`).

A worker subprocess imports this module through `JOBQ_JOB_MODULES=tests.proc_queue_handlers`:
it declares the queues (their limits reach `job_queue` when the worker starts) and brings the
recording handler `recorded` of `tests.toolkit.handlers`, whose jobs the tests enqueue on these
queues (`Job(queue=..., concurrency_key=...)`).
"""

from __future__ import annotations

from jobq.queue import registry
from tests.toolkit import handlers

__all__ = ["handlers"]

KEYED = registry.queue("keyed", max_running_per_key=2)
"""At most 2 jobs of one key running at once, across every worker."""

CAPPED = registry.queue("capped", max_running=3, max_running_per_key=2)
"""At most 3 jobs running at once across every worker, and 2 of one key."""
