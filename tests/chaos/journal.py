"""What happened to every job of a scenario, read back from the database.

Two tables, created by the suite for the duration of a scenario:

- `execution`: one row per execution of the handler (`tests/toolkit/handlers.py`).
- `chaos_journal`: one row per row that entered or left a queue table, written by statement
  triggers (with transition tables, so a batch costs one INSERT) in the transaction that moved
  it: `job` and `job_dead` arrivals, `job_running` arrivals (claims) and departures. Only what
  committed is there.

A claim is a `job_running` row, known by its fencing token. How it ended is read from the
arrivals of the same job in the same transaction: none or `job_done` `succeeded` (completed),
`job_done` `cancelled` (cancel), `job` (retried, released with no attempt charged, or rescued:
the rescue's error text) or `job_dead` (buried, rescued past its last retry, or merged). An
execution belongs to the claim of its job, worker and attempt.

`Analysis` turns this into the figures and invariants of the chaos scenarios.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from jobq.db import Connection
from tests.toolkit.handlers import EXECUTION_TABLE, JOB_TYPE

RESCUE_ERROR = "worker lost while running the job"
"""The `last_error` a rescue records (`jobq.queue.store.rescue`)."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS chaos_journal (
    id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    xid       xid8        NOT NULL DEFAULT pg_current_xact_id(),
    at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    by_app    text        NOT NULL DEFAULT current_setting('application_name'),
    tbl       text        NOT NULL,
    op        text        NOT NULL,
    job_id    bigint      NOT NULL,
    job_type  text        NOT NULL,
    worker_id integer,
    token     bigint,
    attempts  integer     NOT NULL,
    last_error text,
    -- of claims: the job's key and the claim's time as its worker gave it (what rates count)
    concurrency_key text,
    claimed_at timestamptz
);

CREATE OR REPLACE FUNCTION chaos_journal_queued() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO chaos_journal (tbl, op, job_id, job_type, attempts, last_error)
    SELECT TG_TABLE_NAME, 'insert', id, job_type, attempts, last_error FROM arrived;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION chaos_journal_claimed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO chaos_journal (tbl, op, job_id, job_type, worker_id, token, attempts,
                               concurrency_key, claimed_at)
    SELECT 'job_running', 'insert', id, job_type, worker_id, token, attempts, concurrency_key,
           claimed_at
    FROM arrived;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION chaos_journal_released() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO chaos_journal (tbl, op, job_id, job_type, worker_id, token, attempts)
    SELECT 'job_running', 'delete', id, job_type, worker_id, token, attempts FROM departed;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION chaos_journal_done() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO chaos_journal (tbl, op, job_id, job_type, attempts, last_error)
    SELECT 'job_done', state, id, job_type, attempts, last_error FROM arrived;
    RETURN NULL;
END $$;

CREATE OR REPLACE TRIGGER chaos_journal AFTER INSERT ON job
    REFERENCING NEW TABLE AS arrived FOR EACH STATEMENT EXECUTE FUNCTION chaos_journal_queued();
CREATE OR REPLACE TRIGGER chaos_journal AFTER INSERT ON job_dead
    REFERENCING NEW TABLE AS arrived FOR EACH STATEMENT EXECUTE FUNCTION chaos_journal_queued();
CREATE OR REPLACE TRIGGER chaos_journal_in AFTER INSERT ON job_running
    REFERENCING NEW TABLE AS arrived FOR EACH STATEMENT EXECUTE FUNCTION chaos_journal_claimed();
CREATE OR REPLACE TRIGGER chaos_journal_out AFTER DELETE ON job_running
    REFERENCING OLD TABLE AS departed FOR EACH STATEMENT EXECUTE FUNCTION chaos_journal_released();
CREATE OR REPLACE TRIGGER chaos_journal AFTER INSERT ON job_done
    REFERENCING NEW TABLE AS arrived FOR EACH STATEMENT EXECUTE FUNCTION chaos_journal_done();
"""

DROP = """
DROP TRIGGER IF EXISTS chaos_journal ON job;
DROP TRIGGER IF EXISTS chaos_journal ON job_dead;
DROP TRIGGER IF EXISTS chaos_journal_in ON job_running;
DROP TRIGGER IF EXISTS chaos_journal_out ON job_running;
DROP TRIGGER IF EXISTS chaos_journal ON job_done;
DROP TABLE IF EXISTS chaos_journal, execution;
DROP FUNCTION IF EXISTS chaos_journal_queued(), chaos_journal_claimed(), chaos_journal_released(),
    chaos_journal_done();
"""


async def install(conn: Connection) -> None:
    """Create the tables and triggers (empty)."""
    await conn.execute(DROP)
    await conn.execute(EXECUTION_TABLE)
    await conn.execute(SCHEMA)


async def enqueued(conn: Connection, job_type: str = JOB_TYPE) -> set[int]:
    """The ids of every job of `job_type` enqueued since `install`."""
    ids: list[int] | None = await conn.fetchval(
        "SELECT array_agg(DISTINCT job_id) FROM chaos_journal WHERE tbl = 'job' AND job_type = $1",
        job_type,
    )
    return set(ids or [])


async def uninstall(conn: Connection) -> None:
    """Drop the triggers and tables, so that nothing else in the test session pays for them."""
    await conn.execute(DROP)


@dataclass
class Execution:
    """A row of `execution`."""

    id: int
    job_id: int
    attempt: int
    worker_id: int
    pid: int
    started_at: datetime
    finished_at: datetime | None
    outcome: str | None


@dataclass
class Claim:
    """One stay of a job in `job_running`, and how it ended (`end` is None while it lasts):
    complete, retry, release, bury, rescue, merged, cancel. `claimed_at` and `ended_at` are the
    server's clock at the end of the transactions that moved the row (the last trigger time of
    each, the closest to its commit the journal knows); `clock_at` is the claim's time as
    its worker gave it (`job_running.claimed_at`, what the rate windows count)."""

    token: int
    job_id: int
    worker_id: int
    attempts: int
    claimed_at: datetime
    ended_at: datetime | None = None
    end: str | None = None
    concurrency_key: str | None = None
    clock_at: datetime | None = None
    executions: list[Execution] = field(default_factory=list)


def percentile(values: list[float], q: float) -> float | None:
    """The `q`-quantile (0..1) of `values` (linear interpolation), or None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def seconds(values: list[float], q: float) -> float | None:
    """`percentile` rounded to milliseconds."""
    value = percentile(values, q)
    return None if value is None else round(value, 3)


class Analysis:
    """Every claim and execution of the jobs `job_ids`, read in one go by `load()`."""

    def __init__(self, job_ids: set[int]) -> None:
        self.job_ids = job_ids
        self.claims: dict[int, list[Claim]] = defaultdict(list)
        self.executions: dict[int, list[Execution]] = defaultdict(list)
        self.dead: set[int] = set()
        self.cancelled: set[int] = set()
        """Jobs that ended cancelled (`job_done`)."""
        self.where: dict[int, list[str]] = defaultdict(list)
        self.orphan_executions: list[Execution] = []

    @classmethod
    async def load(cls, conn: Connection, job_ids: set[int]) -> Analysis:
        """Read the journal, the executions and the queue tables for `job_ids`."""
        self = cls(job_ids)
        ids = sorted(job_ids)
        # Every change of a transaction becomes visible at its commit: each row's time is the
        # last trigger time of its transaction (the closest to the commit the journal knows).
        # A row's own trigger time would tell a claim and the end of another claim that one
        # transaction makes apart (statement triggers fire at the end of each statement, and
        # the claim's statements are several), though no other transaction can see them apart.
        rows: list[Any] = [
            {**r, "at": r["committed_at"]}
            for r in await conn.fetch(
                "SELECT * FROM (SELECT *, max(at) OVER (PARTITION BY xid) AS committed_at"
                " FROM chaos_journal) AS j WHERE job_id = ANY($1::bigint[]) ORDER BY id",
                ids,
            )
        ]
        arrivals: dict[tuple[Any, int], dict[str, Any]] = {}
        by_token: dict[int, Claim] = {}
        departures = []
        for r in rows:
            if r["tbl"] == "job_running" and r["op"] == "insert":
                claim = Claim(r["token"], r["job_id"], r["worker_id"], r["attempts"], r["at"])
                claim.concurrency_key = r["concurrency_key"]
                claim.clock_at = r["claimed_at"]
                by_token[claim.token] = claim
                self.claims[claim.job_id].append(claim)
            elif r["tbl"] == "job_running":
                departures.append(r)
            else:
                arrivals[(r["xid"], r["job_id"])] = dict(r)
        for r in departures:
            claim = by_token[r["token"]]
            claim.ended_at = r["at"]
            arrival = arrivals.get((r["xid"], r["job_id"]))
            claim.end = _ending(claim, arrival)
        for r in await conn.fetch(
            "SELECT * FROM execution WHERE job_id = ANY($1::bigint[]) ORDER BY id", ids
        ):
            execution = Execution(**dict(r))
            self.executions[execution.job_id].append(execution)
            # The claim it ran under: the latest one by its worker, at its attempt, made before
            # it started. A worker can claim a job twice at one attempt: a release (on a stop,
            # or of a claim whose answer was lost) charges no attempt.
            candidates = [
                c
                for c in self.claims[execution.job_id]
                if c.worker_id == execution.worker_id
                and c.attempts + 1 == execution.attempt
                and c.claimed_at <= execution.started_at
            ]
            owner = max(candidates, key=lambda c: c.claimed_at) if candidates else None
            if owner is None:
                self.orphan_executions.append(execution)
            else:
                owner.executions.append(execution)
        for r in await conn.fetch(
            "SELECT id, 'job' AS t FROM job WHERE id = ANY($1::bigint[])"
            " UNION ALL SELECT id, 'job_running' FROM job_running WHERE id = ANY($1::bigint[])"
            " UNION ALL SELECT id, 'job_dead' FROM job_dead WHERE id = ANY($1::bigint[])",
            ids,
        ):
            self.where[r["id"]].append(r["t"])
            if r["t"] == "job_dead":
                self.dead.add(r["id"])
        self.cancelled = {
            r["id"]
            for r in await conn.fetch(
                "SELECT id FROM job_done WHERE id = ANY($1::bigint[]) AND state = 'cancelled'", ids
            )
        }
        return self

    # -- per job -------------------------------------------------------------------------------

    def completion(self, job_id: int) -> Claim | None:
        """The claim that completed the job, if one did."""
        done = [c for c in self.claims[job_id] if c.end == "complete"]
        return done[0] if done else None

    # -- the invariants ----------------------------------------------------------------------

    def not_finished(self) -> list[int]:
        """Jobs still queued or running."""
        return sorted(j for j in self.job_ids if set(self.where[j]) - {"job_dead"})

    def in_two_places(self) -> list[int]:
        return sorted(j for j in self.job_ids if len(self.where[j]) > 1)

    def lost(self) -> list[int]:
        """Jobs neither dead nor completed after an execution that ran to its end: gone from
        the queue without their work done (or never seen again)."""
        lost = []
        for job_id in self.job_ids:
            if job_id in self.dead or job_id in self.cancelled or self.where[job_id]:
                continue
            done = self.completion(job_id)
            if done is None or not any(e.outcome == "ok" for e in done.executions):
                lost.append(job_id)
        return sorted(lost)

    def completed_twice(self) -> list[int]:
        return sorted(
            j for j in self.job_ids if sum(c.end == "complete" for c in self.claims[j]) > 1
        )

    def run_twice(self) -> list[int]:
        """Jobs whose handler started more than once."""
        return sorted(j for j in self.job_ids if len(self.executions[j]) > 1)

    def executions_after_completion(self) -> list[Execution]:
        """Executions that started after their job's completion was recorded."""
        late = []
        for job_id in self.job_ids:
            done = self.completion(job_id)
            if done is not None and done.ended_at is not None:
                late += [e for e in self.executions[job_id] if e.started_at > done.ended_at]
        return late

    def started_after_cancel(self, cancelled_at: dict[int, datetime]) -> list[Execution]:
        """Executions that started after their job's cancel had committed (`cancelled_at`: job
        id -> a time after its cancel's COMMIT returned)."""
        return [
            e
            for job_id, at in cancelled_at.items()
            for e in self.executions[job_id]
            if e.started_at > at
        ]

    def rescued(self) -> list[Claim]:
        return [c for claims in self.claims.values() for c in claims if c.end == "rescue"]

    def reruns_while_first_runner_lived(self, died_at: dict[int, datetime]) -> list[Claim]:
        """Claims that had started their handler and were rescued although their worker had
        not died (`died_at`: worker id -> when it was killed or stopped) before the rescue:
        a second run while the first runner lived (guarantee 3)."""
        bad = []
        for claim in self.rescued():
            death = died_at.get(claim.worker_id)
            alive = death is None or (claim.ended_at is not None and claim.ended_at < death)
            if alive and claim.executions:
                bad.append(claim)
        return bad

    def unexplained_reruns(self) -> list[int]:
        """Jobs run more than once where an earlier execution's claim ended neither by a
        failure, a release, nor a rescue (whether that rescue was right is
        `reruns_while_first_runner_lived`'s question)."""
        bad = []
        for job_id in self.run_twice():
            for claim in self.claims[job_id]:
                if not claim.executions or claim.end is None:
                    continue
                first = claim.executions[0].started_at
                if not any(e.started_at > first for e in self.executions[job_id]):
                    continue
                if claim.end not in ("retry", "release", "bury", "rescue"):
                    bad.append(job_id)
                    break
        return sorted(bad)

    def claims_held_at(self, worker_id: int, at: datetime) -> list[Claim]:
        """The claims of `worker_id` that it held at `at` and that a rescue ended."""
        return [
            c
            for claims in self.claims.values()
            for c in claims
            if c.worker_id == worker_id
            and c.claimed_at < at
            and c.end == "rescue"
            and c.ended_at is not None
            and c.ended_at > at
        ]

    def next_claim(self, claim: Claim) -> Claim | None:
        """The claim of the same job after `claim`, if any."""
        later = [c for c in self.claims[claim.job_id] if c.claimed_at > claim.claimed_at]
        return min(later, key=lambda c: c.claimed_at) if later else None

    def ends(self) -> dict[str, int]:
        """How many claims ended each way."""
        counts: dict[str, int] = defaultdict(int)
        for claims in self.claims.values():
            for c in claims:
                counts[c.end or "running"] += 1
        return dict(sorted(counts.items()))

    def invariants(self) -> dict[str, list[Any]]:
        """The invariants of the suite that need no knowledge of the scenario, each as the list
        of its violations (empty: it holds). See also `reruns_while_first_runner_lived`."""
        return {
            "not_completed_nor_dead": self.not_finished(),
            "in_two_places": self.in_two_places(),
            "lost": self.lost(),
            "completed_twice": self.completed_twice(),
            "executions_after_completion": [
                (e.job_id, e.id) for e in self.executions_after_completion()
            ],
            "executions_without_claim": [(e.job_id, e.id) for e in self.orphan_executions],
            "unexplained_reruns": self.unexplained_reruns(),
        }


def _ending(claim: Claim, arrival: dict[str, Any] | None) -> str:
    if arrival is None:
        return "complete"
    if arrival["tbl"] == "job_done":
        return "complete" if arrival["op"] == "succeeded" else "cancel"
    error = arrival["last_error"] or ""
    if arrival["tbl"] == "job_dead":
        if error == RESCUE_ERROR:
            return "rescue"
        return "merged" if error.startswith("merged into") else "bury"
    if error == RESCUE_ERROR and arrival["attempts"] == claim.attempts + 1:
        return "rescue"
    return "release" if arrival["attempts"] == claim.attempts else "retry"
