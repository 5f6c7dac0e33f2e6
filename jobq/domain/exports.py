"""Exports: a user's reminders as an iCalendar file, rendered by a `render_export` job in the
worker's thread pool. Status is derived: `done` once the file is stored, `failed` while its job
is in the dead letter, `pending` otherwise."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import AwareDatetime, BaseModel

from jobq import clock, db
from jobq.domain.users import require_user
from jobq.errors import LimitReached, NotFound
from jobq.queue import Job, enqueue

RENDER_EXPORT = "render_export"
QUEUE = "exports"
"""The queue of exports; one export of a user renders at a time (per-key limit 1, key
`user:<id>`)."""


class ExportStatus(StrEnum):
    """Where an export stands: `pending`, `done` (the file is ready), or `failed`."""

    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"


class Export(BaseModel):
    """An export and where it stands."""

    id: int
    user_id: int
    status: ExportStatus
    status_url: str
    download_url: str | None
    last_error: str | None
    job_id: int | None
    created_at: AwareDatetime
    finished_at: AwareDatetime | None


_SELECT = """
SELECT e.id, e.user_id, e.job_id, e.created_at, e.finished_at,
       CASE WHEN e.content IS NOT NULL THEN 'done'
            -- dead, cancelled, or gone (discarded from the dead letter, pruned)
            WHEN s.state IS NULL OR s.state NOT IN ('queued', 'running') THEN 'failed'
            ELSE 'pending' END AS status,
       s.last_error
FROM exports e LEFT JOIN job_state s ON s.id = e.job_id
WHERE e.id = $1 AND e.user_id = $2
"""


def _export(row: dict[str, object]) -> Export:
    done = row["status"] == "done"
    return Export.model_validate(
        row
        | {
            "status_url": f"/exports/{row['id']}",
            "download_url": f"/exports/{row['id']}.ics" if done else None,
        }
    )


async def request_export(user_id: int, *, max_exports: int) -> Export:
    """Insert a pending export and enqueue its job. Raises: `NotFound` for an unknown user;
    `LimitReached` when the user has `max_exports` exports (checked under a lock of the user's
    row)."""
    conn = db.conn()
    await require_user(user_id)
    await conn.execute("SELECT FROM users WHERE id = $1 FOR NO KEY UPDATE", user_id)
    held = await conn.fetchval("SELECT count(*) FROM exports WHERE user_id = $1", user_id)
    if held >= max_exports:
        raise LimitReached("too many exports: use the ones made", limit=max_exports)
    export_id: int = await conn.fetchval(
        "INSERT INTO exports (user_id, created_at) VALUES ($1, $2) RETURNING id",
        user_id,
        clock.now(),
    )
    job = await enqueue(
        Job(
            job_type=RENDER_EXPORT,
            arguments={"export_id": export_id},
            queue=QUEUE,
            concurrency_key=f"user:{user_id}",
        )
    )
    await conn.execute("UPDATE exports SET job_id = $2 WHERE id = $1", export_id, job.id)
    return await get_export(export_id, user_id)


async def get_export(export_id: int, user_id: int) -> Export:
    """Return the user's export and its status. Raises: `NotFound` (also when it is another
    user's)."""
    row = await db.conn().fetchrow(_SELECT, export_id, user_id)
    if row is None:
        raise NotFound("no such export", export_id=export_id)
    return _export(dict(row))


async def export_file(export_id: int, user_id: int) -> str | None:
    """Return the iCalendar text of the user's finished export, or None while it is not done.
    Raises: `NotFound` (also when it is another user's)."""
    row = await db.conn().fetchrow(
        "SELECT content FROM exports WHERE id = $1 AND user_id = $2", export_id, user_id
    )
    if row is None:
        raise NotFound("no such export", export_id=export_id)
    content: str | None = row["content"]
    return content


class CalendarEntry(BaseModel):
    """One reminder as the renderer sees it."""

    reminder_id: int
    message: str
    remind_at: datetime
    created_at: datetime


class ExportSource(BaseModel):
    """What the renderer needs: the user and their reminders."""

    export_id: int
    user_id: int
    user_name: str
    entries: list[CalendarEntry]


async def export_source(export_id: int) -> ExportSource | None:
    """Return the data of an export still to render, or None (done already, or gone)."""
    conn = db.conn()
    head = await conn.fetchrow(
        "SELECT e.user_id, u.name FROM exports e JOIN users u ON u.id = e.user_id"
        " WHERE e.id = $1 AND e.content IS NULL",
        export_id,
    )
    if head is None:
        return None
    rows = await conn.fetch(
        "SELECT id AS reminder_id, message, remind_at, created_at FROM reminders"
        " WHERE user_id = $1 ORDER BY remind_at, id",
        head["user_id"],
    )
    return ExportSource(
        export_id=export_id,
        user_id=head["user_id"],
        user_name=head["name"],
        entries=[CalendarEntry.model_validate(dict(r)) for r in rows],
    )


async def store_export(export_id: int, content: str) -> bool:
    """Store the rendered file once; return False when it was stored already."""
    status = await db.conn().execute(
        "UPDATE exports SET content = $2, finished_at = $3 WHERE id = $1 AND content IS NULL",
        export_id,
        content,
        clock.now(),
    )
    return status == "UPDATE 1"
