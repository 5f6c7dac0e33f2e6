"""Schedules for the real-process schedule test (`tests/test_schedule_processes.py`).

A worker subprocess imports this module through `JOBQ_JOB_MODULES=tests.proc_schedule_handlers`:
it declares five schedules firing every second, each enqueueing the recording handler
`recorded` of `tests.toolkit.handlers` with its own arguments.
"""

from __future__ import annotations

from jobq.queue import registry
from tests.toolkit import handlers

SCHEDULES = 5

for i in range(SCHEDULES):
    registry.periodic(every=1, name=f"tick-{i}", arguments={"n": i})(handlers.recorded)
