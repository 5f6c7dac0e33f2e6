"""The benchmark's queues, declared with their limits in the worker processes that import this
module (`JOBQ_JOB_MODULES=bench.handlers,bench.queues`; `JOBQ_QUEUES` picks which they serve).

- `bench_free`: no limits, the reference of `limits_overhead`.
- `bench_limited`: every kind of limit, none binding at the benchmark's pace: 10,000 running,
  1,000 running per key, 10,000,000 claims per second, 1,000,000 per key per second.
- `bench_slow` and `bench_fast`: no limits, for `queue_isolation`.
- `bench_held`: one job running per key, for `held_back_claim` (which claims in SQL, no worker).
- `bench_rated`: one start a minute, for `rate_held_claim` (which claims in SQL, no worker).
"""

from __future__ import annotations

from datetime import timedelta

from jobq.queue.registry import Rate, registry

FREE = "bench_free"
LIMITED = "bench_limited"
SLOW = "bench_slow"
FAST = "bench_fast"
HELD = "bench_held"
RATED = "bench_rated"

SECOND = timedelta(seconds=1)

registry.queue(FREE)
registry.queue(
    LIMITED,
    max_running=10_000,
    max_running_per_key=1_000,
    rate=Rate(10_000_000, SECOND),
    rate_per_key=Rate(1_000_000, SECOND),
)
registry.queue(SLOW)
registry.queue(FAST)
registry.queue(HELD, max_running_per_key=1)
registry.queue(RATED, rate=Rate(1, timedelta(minutes=1)))
