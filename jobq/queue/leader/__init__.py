"""The leader's services: the fleet's upkeep, run by one worker so that its cost does not grow
with the number of workers.

The leader is elected by the heartbeat itself (`sql.worker_heartbeat`, table `job_leader`): a
worker takes the lead when the last leader's lease has run out (a hung leader) or its liveness
lock is gone (a dead one), and renews it at each heartbeat. Every worker starts these services,
but each runs rounds only while its worker leads (`Service.when`): the others run no timer.
Each service has the one shape of `jobq.queue.service.Service` (`run_once()` returns a count):

- `rescue`: the jobs of dead or hung workers back to the queue (`rescue.rescuer`);
- `prune`: retention of finished jobs, by day partitions and by rows (`prune.pruner`);
- `schedules`: the schedules' occurrences enqueued, each once (`schedules.scheduler`);
- `depth`: the queue depths counted for the metrics (`depth.depth_snapshot`);
- `history`: each queue's counts and timings, a row a minute, for the dashboard's charts
  (`history.history_writer`).

The lead can change hands in the middle of a round, so each round is correct however many
run at once: the rescue moves each lost job in one `DELETE` (a rescue at the same time finds it
gone), two pruners only make each other's DDL fail or delete nothing, the scheduler locks each
schedule it handles, and the depth snapshot is taken by the winner of its own election
(`depth.elect`), and the history's minute is its key (a second writer changes nothing).
"""

from __future__ import annotations

from jobq.config import Settings
from jobq.db import Database
from jobq.queue.leader.depth import depth_snapshot
from jobq.queue.leader.history import history_writer
from jobq.queue.leader.prune import pruner
from jobq.queue.leader.rescue import rescuer
from jobq.queue.leader.schedules import scheduler
from jobq.queue.registry import Registry
from jobq.queue.service import Service

__all__ = [
    "Service",
    "depth_snapshot",
    "history_writer",
    "pruner",
    "rescuer",
    "scheduler",
    "services",
]


def services(database: Database, settings: Settings, handlers: Registry) -> tuple[Service, ...]:
    """The leader's services on `database`, with their intervals from `settings` and the job
    types of `handlers` (for the schedules' queues and retries), in the order they start."""
    return (
        rescuer(database, settings),
        pruner(database, settings),
        scheduler(database, settings, handlers),
        depth_snapshot(database, settings),
        history_writer(database),
    )
