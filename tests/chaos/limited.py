"""The limited queue of the limits scenario (`test_limits.py`): its name and limits.

Importing this module declares nothing; worker subprocesses import `tests.chaos.limited_worker`
(`JOBQ_JOB_MODULES`), which declares the queue with these limits in their registry.
"""

from __future__ import annotations

from datetime import timedelta

from jobq.queue.registry import Rate, Registry

QUEUE = "limited"
MAX_RUNNING_PER_KEY = 2
"""At most 2 jobs of one concurrency key in `job_running` at once, across all workers."""
RATE_PER_KEY = Rate(5, timedelta(seconds=1))
"""At most 5 claims of one concurrency key in any 1 s."""


def declare(handlers: Registry) -> None:
    """Declare the limited queue with its limits in `handlers`."""
    handlers.queue(QUEUE, max_running_per_key=MAX_RUNNING_PER_KEY, rate_per_key=RATE_PER_KEY)
