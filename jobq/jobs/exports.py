"""`render_export`: render a user's reminders as an iCalendar file, in the thread pool."""

from __future__ import annotations

from datetime import UTC, datetime

from icalendar import Calendar, Event
from pydantic import BaseModel

from jobq import clock
from jobq.config import Settings
from jobq.db import transaction
from jobq.domain import exports
from jobq.domain.exports import ExportSource
from jobq.queue import JobContext, handler


class RenderExportArgs(BaseModel):
    """Arguments of `render_export`."""

    export_id: int


def render_ics(source: ExportSource, *, stamp: datetime) -> str:
    """Return an iCalendar (RFC 5545) file with one event per reminder, at its due time."""
    calendar = Calendar()
    calendar.add("prodid", "-//jobq//reminders//EN")
    calendar.add("version", "2.0")
    calendar.add("x-wr-calname", f"Reminders of {source.user_name}")
    for entry in source.entries:
        event = Event()
        event.add("uid", f"reminder-{entry.reminder_id}@jobq")
        event.add("dtstamp", stamp)
        event.add("created", entry.created_at.astimezone(UTC))
        event.add("dtstart", entry.remind_at.astimezone(UTC))
        event.add("summary", entry.message)
        calendar.add_component(event)
    text: str = calendar.to_ical().decode()
    return text


async def _load(export_id: int) -> ExportSource | None:
    async with transaction(readonly=True):
        return await exports.export_source(export_id)


async def _store(source: ExportSource, content: str, *, max_bytes: int) -> bool:
    async with transaction():
        return await exports.store_export(
            source.export_id, source.user_id, content, max_bytes=max_bytes
        )


@handler(exports.RENDER_EXPORT, args=RenderExportArgs, queue=exports.QUEUE, timeout=120)
def render_export(args: RenderExportArgs, job: JobContext) -> None:
    """A plain `def`: runs in the worker's thread pool, so rendering never blocks the event
    loop; its database reads and writes run on the loop through `job.run_coroutine`. A file
    that would take the user's exports past `JOBQ_MAX_EXPORT_BYTES_PER_USER` fails the export
    for good (`TooLarge`, to the dead letter)."""
    settings: Settings = job.state["settings"]
    source = job.run_coroutine(_load(args.export_id))
    if source is None:
        return  # rendered by an earlier run, or gone
    content = render_ics(source, stamp=clock.now())
    job.run_coroutine(_store(source, content, max_bytes=settings.max_export_bytes_per_user))
