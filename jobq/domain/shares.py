"""Fair shares of reminder delivery: per user, and per webhook address.

A delivery is limited twice, so that a few users behind slow webhooks cannot hold every
delivery slot:

- **per user**: the `reminders` queue's per-key limit (`reminder_user_max_running` at once,
  across every worker), its key the user (`delivery_key`): the queue never claims more of one
  user's deliveries, and the others keep their place;
- **per address**: `reminder_host_max_running` attempts at once and `reminder_host_rate` starts
  per `reminder_host_rate_period` to one webhook address (IPv4, or an IPv6 /64), whatever the
  names that resolve to it, counted in the `webhook_hold` and `webhook_start` tables (`take`
  and `release`, exact across processes: sql/functions/webhook_hold_take.sql). The address is
  known only once the attempt has resolved the name, so this limit is taken by the attempt
  itself: one that finds the address full is snoozed (`jobq.errors.Snooze`: no attempt
  charged) until a slot may be free, at most `MAX_WAIT` later.

A hold lasts until its attempt ends (`release`), or at most `webhook_total_timeout` plus
`HOLD_MARGIN` after it began: the deadline of the whole attempt, so a worker killed mid-attempt
keeps no slot past it.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta

from jobq import db, statements
from jobq.config import Settings

HOLD_MARGIN = timedelta(seconds=5)
"""How long past the attempt's deadline a hold of a worker that died still counts."""
MAX_WAIT = timedelta(seconds=0.5)
"""The longest an attempt that found its address full waits before it looks again (a hold may
end before its deadline, at its attempt's end), before its jitter (`take`)."""


def delivery_key(user_id: int) -> str:
    """The concurrency key of user `user_id`'s deliveries in the `reminders` queue."""
    return f"user:{user_id}"


async def take(address: str, now: datetime, settings: Settings) -> int | timedelta:
    """Take a hold on one of `address`'s delivery slots (`Target.share_key`) at `now`, in a
    statement of its own (its own transaction, committed without waiting for the disk, so that
    the takes of one address do not queue behind each other's flushes), then make it durable
    (a second statement, whose flush joins those of the other commits): a database crash loses
    no hold whose attempt may have started. Return its id, or, when the address is at its
    limits, how long to wait before trying again: until a slot may be free, at most `MAX_WAIT`,
    times a random 1 to 1.5 (so that the attempts waiting on one address spread out)."""
    async with db.current_database().pool.acquire() as conn:
        row = await statements.webhook_hold_take.fetchrow(
            conn,
            address=address,
            now=now,
            held_until=now + settings.webhook_total_timeout + HOLD_MARGIN,
            max_running=settings.reminder_host_max_running,
            max_starts=settings.reminder_host_rate,
            period=settings.reminder_host_rate_period,
        )
        assert row is not None  # the function returns one row
        if row["hold_id"] is not None:
            hold_id: int = row["hold_id"]
            await statements.webhook_hold_confirm.execute(conn, hold_id=hold_id)
            return hold_id
    wait: timedelta = min(max(row["retry_at"] - now, timedelta(0)), MAX_WAIT)
    return wait * random.uniform(1.0, 1.5)


async def release(hold_id: int) -> None:
    """End hold `hold_id`, in the caller's transaction (its start still counts within the rate
    window)."""
    await statements.webhook_hold_release.execute(db.conn(), hold_id=hold_id)
