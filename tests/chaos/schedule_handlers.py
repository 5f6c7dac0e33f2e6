"""Imported by the workers of the schedules scenario (`JOBQ_JOB_MODULES`): 50 schedules firing
every second (`chaos-tick-0` .. `chaos-tick-49`), each enqueueing the recording handler
`recorded` of `tests.toolkit.handlers` with its own arguments (`n`: the schedule's number), so
that every execution lands in the `execution` table. The test process does not import this
module: its registry would hold the 50 schedules."""

from jobq.queue.registry import registry
from tests.toolkit import handlers

SCHEDULES = 50
PREFIX = "chaos-tick-"

for n in range(SCHEDULES):
    registry.periodic(every=1, name=f"{PREFIX}{n}", arguments={"n": n})(handlers.recorded)
