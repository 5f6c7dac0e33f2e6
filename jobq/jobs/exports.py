"""`render_export` and `render_export_part`: a user's reminders as an iCalendar file, rendered
in the thread pool; a big export renders in parts, in parallel (a batch), which `render_export`,
the batch's callback, assembles (`jobq.domain.exports`)."""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel, Field

from jobq import clock
from jobq.config import Settings
from jobq.db import transaction
from jobq.domain import exports
from jobq.domain.exports import CalendarEntry, ExportSource
from jobq.errors import DontRetry
from jobq.queue import JobContext, dependencies, handler, report_progress_from_thread

END = "END:VCALENDAR\r\n"


class RenderExportArgs(BaseModel):
    """Arguments of `render_export`."""

    export_id: int


class RenderPartArgs(BaseModel):
    """Arguments of `render_export_part`: the part's number (from 0) and its reminders."""

    export_id: int
    part: int = Field(ge=0)
    reminder_ids: list[int]


def render_events(entries: list[CalendarEntry], *, stamp: datetime) -> str:
    """Return one iCalendar VEVENT per reminder, at its due time, in order (CRLF lines)."""
    from icalendar import Event  # here: only the processes that render an export import it

    text = []
    for entry in entries:
        event = Event()
        event.add("uid", f"reminder-{entry.reminder_id}@jobq")
        event.add("dtstamp", stamp)
        event.add("created", entry.created_at.astimezone(UTC))
        event.add("dtstart", entry.remind_at.astimezone(UTC))
        event.add("summary", entry.message)
        text.append(event.to_ical().decode())
    return "".join(text)


def calendar(user_name: str, events: str) -> str:
    """Return an iCalendar (RFC 5545) file of the user's `events` (from `render_events`)."""
    from icalendar import Calendar

    head = Calendar()
    head.add("prodid", "-//jobq//reminders//EN")
    head.add("version", "2.0")
    head.add("x-wr-calname", f"Reminders of {user_name}")
    empty: str = head.to_ical().decode()
    return empty.removesuffix(END) + events + END


def render_ics(source: ExportSource, *, stamp: datetime) -> str:
    """Return an iCalendar file with one event per reminder, at its due time."""
    return calendar(source.user_name, render_events(source.entries, stamp=stamp))


async def _load(export_id: int, reminder_ids: list[int] | None = None) -> ExportSource | None:
    async with transaction(readonly=True):
        return await exports.export_source(export_id, reminder_ids)


async def _parts(export_id: int) -> list[str]:
    async with transaction(readonly=True):
        return await exports.parts(export_id)


async def _store(source: ExportSource, content: str, *, max_bytes: int) -> bool:
    async with transaction():
        return await exports.store_export(
            source.export_id, source.user_id, content, max_bytes=max_bytes
        )


async def _store_part(export_id: int, part: int, content: str) -> None:
    async with transaction():
        await exports.store_part(export_id, part, content)


@handler(exports.RENDER_EXPORT, args=RenderExportArgs, queue=exports.QUEUE, timeout=120)
def render_export(args: RenderExportArgs, job: JobContext) -> None:
    """A plain `def`: runs in the worker's thread pool, so rendering never blocks the event
    loop; its database reads and writes run on the loop through `job.run_coroutine`. An
    export of parts is assembled from them, once every part has ended (it is their batch's
    callback); a part that failed or was cancelled fails the export. A file that would take
    the user's exports past `JOBQ_MAX_EXPORT_BYTES_PER_USER` fails the export for good
    (`TooLarge`, to the dead letter)."""
    settings: Settings = job.state["settings"]
    source = job.run_coroutine(_load(args.export_id))
    if source is None:
        return  # rendered by an earlier run, or gone
    if source.num_parts:
        ended = job.run_coroutine(dependencies(job.id))
        if ended.failed or ended.cancelled:
            missing = ended.failed + ended.cancelled
            raise DontRetry(f"{missing} of {source.num_parts} parts of the export failed")
        content = calendar(source.user_name, "".join(job.run_coroutine(_parts(args.export_id))))
    else:
        content = render_ics(source, stamp=clock.now())
    job.run_coroutine(_store(source, content, max_bytes=settings.max_export_bytes_per_user))


@handler(exports.RENDER_EXPORT_PART, args=RenderPartArgs, queue=exports.QUEUE, timeout=120)
def render_export_part(args: RenderPartArgs, job: JobContext) -> None:
    """Render one part of a big export (its reminders' events) and store it; the export's
    status counts the parts stored as its progress, and this job reports its own."""
    source = job.run_coroutine(_load(args.export_id, args.reminder_ids))
    if source is None:
        return  # the export is done already, or gone
    report_progress_from_thread(job, 0.0, f"part {args.part + 1} of {source.num_parts}")
    content = render_events(source.entries, stamp=clock.now())
    job.run_coroutine(_store_part(args.export_id, args.part, content))
