"""The schedules of the `schedule_lateness` workload (`bench.schedule_bench`), imported by its
worker processes through `JOBQ_JOB_MODULES=bench.handlers,bench.schedule_handlers`: 100
schedules firing every 2 s (`bench-tick-0` .. `bench-tick-99`), each enqueueing `bench_stamp`
(`bench.handlers`) with its own `seq` (the schedule's number). A worker writes them to
`job_schedule` as it starts."""

from bench.handlers import bench_stamp
from jobq.queue.registry import registry

SCHEDULES = 100
EVERY_S = 2
PREFIX = "bench-tick-"

for seq in range(SCHEDULES):
    registry.periodic(every=EVERY_S, name=f"{PREFIX}{seq}", arguments={"seq": seq})(bench_stamp)
