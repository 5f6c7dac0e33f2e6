"""The queue's statements: named literal blocks of `sql/queries/*.sql` (`control.sql`,
`claim.sql`, …), loaded with every other statement by `jobq.statements`; `sql.job_claim` is
`jobq.statements.STATEMENTS["job_claim"]`. The advisory locks the statements spell out as
literals are named here.
"""

from __future__ import annotations

from jobq.statements import QUERIES_DIR, STATEMENTS, Query, load

__all__ = ["METRICS_LOCK", "QUERIES_DIR", "STATEMENTS", "WORKER_LOCK_CLASS", "Query", "load"]

WORKER_LOCK_CLASS = 1785684593
"""classid ('jobq') of the session advisory locks that tell a worker is alive; objid = worker id.
The statements spell it out as a literal."""

METRICS_LOCK = (WORKER_LOCK_CLASS, -12)
"""The transaction-level advisory lock (classid 'jobq', objid -12: no worker's id) of the
process that takes the depth snapshot (`job_depth_lock`)."""


def __getattr__(name: str) -> Query:
    try:
        return STATEMENTS[name]
    except KeyError:
        raise AttributeError(f"no statement named {name!r} in {QUERIES_DIR}") from None
