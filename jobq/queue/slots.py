"""A worker's queues and slots: which queues it serves (`JOBQ_QUEUES`, or every declared one),
`Slots`, which counts its slots per queue, and `Grants`, the claims it may make with no turn."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from jobq.config import Settings
from jobq.queue.model import ClaimedJob, Grant
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

    def take(self, job: ClaimedJob) -> None:
        self._held[job.token] = job.queue

    def release(self, token: int) -> None:
        self._held.pop(token, None)

    @property
    def tokens(self) -> list[int]:
        """The fencing tokens of the jobs held."""
        return list(self._held)

    def free(self, settling: list[ClaimedJob] | None = None) -> dict[str, int]:
        """Free slots per queue, counting those of `settling` (outcomes being recorded) as free."""
        held = Counter(self._held.values())
        held.subtract(job.queue for job in settling or ())
        return {name: size - held[name] for name, size in self.capacity.items()}

    @property
    def num_free(self) -> int:
        return sum(max(0, n) for n in self.free().values())


class Grants:
    """The grants a worker holds (`job_rate` in sql/schema.sql): per queue with limits, the grant
    and how many jobs it may still claim under it, before its deadline by the event loop's clock
    (its span from the claim that got it: never after its end by the server's clock, which the
    server checks again)."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[Grant, int, float]] = {}  # grant, starts left, deadline

    def claiming(self, free: dict[str, int], at: float) -> dict[str, Grant]:
        """The grants that a claim at loop time `at` (seconds) makes its claims under, per queue.
        Trims `free` (slots per queue) to each one's starts left."""
        under = {}
        for name, (grant, left, deadline) in list(self._held.items()):
            if left <= 0 or at >= deadline:
                del self._held[name]
            elif free.get(name, 0) > 0:
                free[name] = min(free[name], left)
                under[name] = grant
        return under

    def claimed(
        self, at: float, taken: Counter[str], under: dict[str, Grant], made: dict[str, Grant]
    ) -> None:
        """Count the claim sent at loop time `at` (seconds): `taken` jobs per queue, made under
        the grants `under` (`claiming`'s), and the grants its turns `made`."""
        for name in under.keys() & self._held.keys():
            grant, left, deadline = self._held[name]
            self._held[name] = (grant, left - taken[name], deadline)
        for name, grant in made.items():
            self._held[name] = (grant, grant.starts - taken[name], at + grant.span.total_seconds())

    def forfeit(self, names: Iterable[str]) -> None:
        """Give up the grants of queues `names` (a claim under them failed, and may have
        committed)."""
        for name in names:
            self._held.pop(name, None)


def has_limits(spec: QueueSpec) -> bool:
    """Whether queue `spec` has a concurrency or rate limit."""
    return any(
        v is not None
        for v in (spec.max_running, spec.max_running_per_key, spec.rate, spec.rate_per_key)
    )
