"""The schedules of the `schedule_lateness` workload (`bench.schedule_bench`), imported by its
worker processes through `JOBQ_JOB_MODULES=bench.handlers,bench.schedule_handlers`: 100
schedules (`bench-tick-0` .. `bench-tick-99`), each enqueueing `bench_stamp` (`bench.handlers`)
with its own `seq` (the schedule's number). With `JOBQ_BENCH_SHAPE=burst` they fire every 2 s,
all on the same even seconds (100 jobs ripe at once); otherwise (`spread`) every 10 s, schedule
`seq` on the seconds that end in `seq % 10` (10 jobs ripe each second). A worker writes them to
`job_schedule` as it starts."""

import os

from bench.handlers import bench_stamp
from jobq.queue.registry import registry

SCHEDULES = 100
PREFIX = "bench-tick-"
SHAPES = {"spread": 10, "burst": 2}
"""Each shape's period (s): `spread` has 10 phases, one per second of the period."""

for seq in range(SCHEDULES):
    name = f"{PREFIX}{seq}"
    if os.environ.get("JOBQ_BENCH_SHAPE") == "burst":
        registry.periodic(every=SHAPES["burst"], name=name, arguments={"seq": seq})(bench_stamp)
    else:
        cron = f"{seq % 10}-59/10 * * * * *"  # seconds first
        registry.periodic(cron, name=name, arguments={"seq": seq})(bench_stamp)
