"""A worker's queues and slots: which queues it serves (`JOBQ_QUEUES`, or every declared one),
and `Slots`, which counts its slots per queue."""

from __future__ import annotations

from jobq.config import Settings
from jobq.queue.model import ClaimedJob
from jobq.queue.registry import QueueSpec, Registry


class ConfigError(Exception):
    """The worker's queue settings name a queue that no code declares."""


def served_queues(settings: Settings, handlers: Registry) -> dict[str, int]:
    """The queues a worker serves and its slots for each: `settings.queues`, or every declared
    queue with its declared slots (default `settings.max_concurrent_jobs`).
    Raises: `ConfigError` naming a queue of `settings.queues` that is not declared."""
    declared = handlers.queues()
    if not settings.queues:
        return {n: q.slots or settings.max_concurrent_jobs for n, q in sorted(declared.items())}
    unknown = sorted(set(settings.queues) - set(declared))
    if unknown:
        raise ConfigError(
            f"JOBQ_QUEUES names undeclared queue(s) {', '.join(unknown)}; "
            f"declared: {', '.join(sorted(declared))}"
        )
    return dict(settings.queues)


class Slots:
    """A worker's job slots, per queue. A slot is taken when a job is claimed and freed when its
    outcome is settled (recorded, or known to be lost), so a worker never holds more rows of
    `job_running` of a queue than its slots for that queue."""

    def __init__(self, capacity: dict[str, int]) -> None:
        self.capacity = capacity
        self._held: dict[int, str] = {}
        self._taken: dict[str, int] = dict.fromkeys(capacity, 0)
        """The slots taken, by queue (the queues of `_held`, counted as they change)."""

    def take(self, job: ClaimedJob) -> None:
        self._held[job.token] = job.queue
        self._taken[job.queue] = self._taken.get(job.queue, 0) + 1

    def release(self, token: int) -> None:
        queue = self._held.pop(token, None)
        if queue is not None:
            self._taken[queue] -= 1

    @property
    def tokens(self) -> list[int]:
        """The fencing tokens of the jobs held."""
        return list(self._held)

    def free(self, settling: list[ClaimedJob] | None = None) -> dict[str, int]:
        """Free slots per queue, counting those of `settling` (outcomes being recorded) as free."""
        taken = self._taken
        free = {name: size - taken[name] for name, size in self.capacity.items()}
        for job in settling or ():
            if job.queue in free:
                free[job.queue] += 1
        return free

    @property
    def num_free(self) -> int:
        taken = self._taken
        return sum(max(0, size - taken[name]) for name, size in self.capacity.items())


def has_limits(spec: QueueSpec) -> bool:
    """Whether queue `spec` has a concurrency or rate limit."""
    return any(
        v is not None
        for v in (spec.max_running, spec.max_running_per_key, spec.rate, spec.rate_per_key)
    )
