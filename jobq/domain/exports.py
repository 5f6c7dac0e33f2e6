"""Exports: a user's reminders as an iCalendar file, rendered by a `render_export` job in the
worker's thread pool; an export of more than `PART_REMINDERS` reminders renders in parts, in
parallel (a batch of `render_export_part` jobs, each storing its events in `export_parts`), and
`render_export` is the batch's callback, which assembles them. Status is derived: `done` once
the file is stored, `failed` while its job is in the dead letter (or after it was discarded from
there, or cancelled), `pending` otherwise, with its `progress` (the parts rendered); the queue
tells where the job is (`jobq.queue.control.job_states`)."""

from __future__ import annotations

import contextlib
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import AwareDatetime, BaseModel, Field

from jobq import clock, db, statements
from jobq.domain.users import require_user
from jobq.errors import Conflict, DontRetry, LimitReached, NotFound
from jobq.queue import Job, control, enqueue, enqueue_batch
from jobq.queue.control import JobState

RENDER_EXPORT = "render_export"
RENDER_EXPORT_PART = "render_export_part"
PART_REMINDERS = 100
"""The most reminders one part of an export renders."""
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
    parts: int = Field(description="the parts it renders in (0: one job renders it whole)")
    progress: float = Field(description="how much is rendered, 0 to 1 (the parts done)")


def _waiting(job: control.JobStatus | None) -> bool:
    """Whether `job` (None: the queue holds it no more) may still render its export."""
    return job is not None and job.state in (JobState.WAITING, JobState.QUEUED, JobState.RUNNING)


def _export(row: Any, job: control.JobStatus | None) -> Export:
    """An `export_get` row as an `Export`, its status derived from its job's (`job`: None when
    the queue holds no such job: discarded from the dead letter, or pruned)."""
    if row["done"]:
        status = ExportStatus.DONE
    elif not _waiting(job):  # dead, cancelled, or gone (discarded, pruned)
        status = ExportStatus.FAILED
    else:
        status = ExportStatus.PENDING
    return Export(
        id=row["id"],
        user_id=row["user_id"],
        status=status,
        status_url=f"/exports/{row['id']}",
        download_url=f"/exports/{row['id']}.ics" if row["done"] else None,
        last_error=None if job is None else job.last_error,
        job_id=row["job_id"],
        created_at=row["created_at"],
        finished_at=row["finished_at"],
        parts=row["num_parts"],
        progress=1.0 if row["done"] else row["parts_done"] / max(row["num_parts"], 1),
    )


async def request_export(
    user_id: int, *, max_exports: int, max_bytes: int, part_reminders: int = PART_REMINDERS
) -> Export:
    """Insert a pending export and enqueue its job: one `render_export`, or for more than
    `part_reminders` reminders a batch of `render_export_part` jobs (each that many reminders,
    in the export's order, rendered in parallel) whose callback, `render_export`, assembles
    them. The export's `job_id` is `render_export`'s. Raises: `NotFound` for an unknown user;
    `LimitReached` when the user has `max_exports` exports, or files of `max_bytes` bytes or
    more (checked under a lock of the user's row): delete some first."""
    conn = db.conn()
    await require_user(user_id)
    await statements.user_lock.execute(conn, user_id=user_id)
    held = await statements.export_count.fetchval(conn, user_id=user_id)
    if held >= max_exports:
        raise LimitReached(
            "too many exports: delete some first",
            limit=max_exports,
            resource="exports",
        )
    stored = await statements.export_bytes.fetchval(conn, user_id=user_id)
    if stored >= max_bytes:
        raise LimitReached(
            f"the exports' files take {stored} bytes: delete some first",
            limit=max_bytes,
            resource="export_bytes",
        )
    export_id: int = await statements.export_create.fetchval(conn, user_id=user_id, now=clock.now())
    render = Job(
        job_type=RENDER_EXPORT,
        arguments={"export_id": export_id},
        queue=QUEUE,
        concurrency_key=f"user:{user_id}",
    )
    ids = [r["id"] for r in await statements.export_reminder_ids.fetch(conn, user_id=user_id)]
    if len(ids) <= part_reminders:
        job_id = (await enqueue(render)).id
    else:
        parts = [ids[i : i + part_reminders] for i in range(0, len(ids), part_reminders)]
        batch = await enqueue_batch(
            [
                Job(
                    job_type=RENDER_EXPORT_PART,
                    arguments={"export_id": export_id, "part": i, "reminder_ids": part},
                    queue=QUEUE,
                )
                for i, part in enumerate(parts)
            ],
            callback=render,
            name=f"export {export_id}",
        )
        assert batch.callback_id is not None
        job_id = batch.callback_id
        await statements.export_parts_planned.execute(
            conn, export_id=export_id, num_parts=len(parts)
        )
    await statements.export_job_set.execute(conn, export_id=export_id, job_id=job_id)
    return await get_export(export_id, user_id)


async def get_export(export_id: int, user_id: int) -> Export:
    """Return the user's export and its status. Raises: `NotFound` (also when it is another
    user's)."""
    conn = db.conn()
    row = await _export_row(conn, export_id, user_id)
    job = (await control.job_states(conn, [row["job_id"]])).get(row["job_id"])
    if not row["done"] and not _waiting(job):
        # Its job ended after the row was read? A render stores its file before its job ends.
        row = await _export_row(conn, export_id, user_id)
    return _export(row, job)


async def _export_row(conn: db.Connection, export_id: int, user_id: int) -> Any:
    row = await statements.export_get.fetchrow(conn, export_id=export_id, user_id=user_id)
    if row is None:
        raise NotFound("no such export", export_id=export_id)
    return row


async def export_file(export_id: int, user_id: int) -> str | None:
    """Return the iCalendar text of the user's finished export, or None while it is not done.
    Raises: `NotFound` (also when it is another user's)."""
    row = await statements.export_content.fetchrow(db.conn(), export_id=export_id, user_id=user_id)
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
    """What the renderer needs: the user and their reminders (those of one part, for a part;
    none, for the export of parts, whose events are its parts')."""

    export_id: int
    user_id: int
    user_name: str
    num_parts: int
    entries: list[CalendarEntry]


async def export_source(
    export_id: int, reminder_ids: list[int] | None = None
) -> ExportSource | None:
    """Return the data of an export still to render, or None (done already, or gone): every
    reminder of its user, only `reminder_ids` (a part), or none (an export of parts)."""
    conn = db.conn()
    head = await statements.export_owner.fetchrow(conn, export_id=export_id)
    if head is None:
        return None
    if reminder_ids is not None:
        rows = await statements.export_part_entries.fetch(
            conn, user_id=head["user_id"], reminder_ids=reminder_ids
        )
    elif head["num_parts"]:
        rows = []
    else:
        rows = await statements.export_entries.fetch(conn, user_id=head["user_id"])
    return ExportSource(
        export_id=export_id,
        user_id=head["user_id"],
        user_name=head["name"],
        num_parts=head["num_parts"],
        entries=[CalendarEntry.model_validate(dict(r)) for r in rows],
    )


async def store_part(export_id: int, part: int, content: str) -> None:
    """Store part `part` of the export (its events), once."""
    await statements.export_part_store.execute(
        db.conn(), export_id=export_id, part=part, content=content
    )


async def parts(export_id: int) -> list[str]:
    """The parts of the export rendered so far, in order."""
    return [
        r["content"]
        for r in await statements.export_parts_read.fetch(db.conn(), export_id=export_id)
    ]


class TooLarge(DontRetry):
    """The export's file would take its user's exports past their storage cap."""


async def store_export(export_id: int, user_id: int, content: str, *, max_bytes: int) -> bool:
    """Store the rendered file once (and forget its parts); return False when it was stored
    already (or the export is gone). Raises: `TooLarge` when it would take the user's files
    past `max_bytes` (the user's exports are assembled one at a time: the queue's per-key
    limit)."""
    conn = db.conn()
    size = len(content.encode())
    stored = await statements.export_bytes.fetchval(conn, user_id=user_id)
    if stored + size > max_bytes:
        raise TooLarge(
            f"the file is {size} bytes; the user's exports may take {max_bytes - stored} more",
            limit=max_bytes,
        )
    done = await statements.export_store.fetchval(
        conn, export_id=export_id, content=content, now=clock.now()
    )
    if done is not None:
        await statements.export_parts_clear.execute(conn, export_id=export_id)
    return done is not None


async def delete_export(export_id: int, user_id: int, *, retain: bool) -> None:
    """Delete the user's export, its file with it; a pending one's job is cancelled (in the
    caller's transaction; `retain`: keep the cancelled job in `job_done`). Raises: `NotFound`
    (also when it is another user's)."""
    conn = db.conn()
    deleted = await statements.export_delete.fetchrow(conn, export_id=export_id, user_id=user_id)
    if deleted is None:
        raise NotFound("no such export", export_id=export_id)
    if deleted["job_id"] is not None and not deleted["done"]:
        with contextlib.suppress(NotFound, Conflict):  # it ended meanwhile, or is gone
            await control.cancel(conn, deleted["job_id"], now=clock.now(), retain=retain)
