"""Audit lines: admin and key-management actions, on the `jobq.audit` logger (INFO).

One line each: `audit actor=<admin | user:<id> key:<key id>> action=<what> target=<on what>
at=<ISO 8601 UTC> from=<client address>`. Never a key, a token or a request body.
"""

from __future__ import annotations

import logging

from quart import g, request

from jobq import clock

log = logging.getLogger("jobq.audit")


def audit(action: str, target: str) -> None:
    """Log one audit line for this request (see the module): the actor is the user whose key
    authorised it, else the admin."""
    user_id = g.get("jobq_user_id")
    actor = "admin" if user_id is None else f"user:{user_id} key:{g.jobq_key_id}"
    log.info(
        "audit actor=%s action=%s target=%s at=%s from=%s",
        actor,
        action,
        target,
        clock.now().isoformat().replace("+00:00", "Z"),
        request.remote_addr,
    )
