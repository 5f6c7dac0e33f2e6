"""The queues of the limits scenario (`test_limits.py`): their names and limits.

`limited`, with per-key limits that bind: its claims take turns. `global`, with a running limit
and a rate over the whole queue that bind now and then. Importing this module declares nothing;
worker subprocesses import `tests.chaos.limited_worker` (`JOBQ_JOB_MODULES`), which declares the
queues with these limits in their registry.
"""

from __future__ import annotations

from datetime import timedelta

from jobq.queue.registry import Rate, Registry

QUEUE = "limited"
MAX_RUNNING_PER_KEY = 2
"""At most 2 jobs of one concurrency key in `job_running` at once, across all workers."""
RATE_PER_KEY = Rate(5, timedelta(seconds=1))
"""At most 5 claims of one concurrency key in any 1 s."""


GLOBAL = "global"
MAX_RUNNING = 40
"""At most 40 jobs of `global` in `job_running` at once, across all workers (of 64 slots)."""
RATE = Rate(150, timedelta(seconds=1))
"""At most 150 claims of `global` in any 1 s: below the 200 a second its 40 running jobs of
0.2 s could start, so both limits bind now and then."""


def declare(handlers: Registry) -> None:
    """Declare the queues with their limits in `handlers`."""
    handlers.queue(QUEUE, max_running_per_key=MAX_RUNNING_PER_KEY, rate_per_key=RATE_PER_KEY)
    handlers.queue(GLOBAL, max_running=MAX_RUNNING, rate=RATE)
