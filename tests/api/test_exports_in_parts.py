"""A big export renders in parts, in parallel (a batch of `render_export_part` jobs), and its
callback `render_export` assembles the same file a single job renders; its status reports the
parts done as its progress; a part that fails for good fails the export."""

from __future__ import annotations

from datetime import timedelta

from icalendar import Calendar
from quart.typing import TestClientProtocol as Client

from jobq import db
from jobq.config import Settings
from jobq.db import Connection, Database
from jobq.domain import exports
from jobq.jobs import job_state
from jobq.queue import registry
from jobq.testing import drain
from tests.api.helpers import create_reminder, create_user


async def request(user_id: int, part_reminders: int) -> exports.Export:
    async with db.transaction():
        return await exports.request_export(
            user_id, max_exports=10, max_bytes=10**7, part_reminders=part_reminders
        )


async def status(export_id: int, user_id: int) -> exports.Export:
    async with db.transaction(readonly=True):
        return await exports.get_export(export_id, user_id)


def summaries(text: str) -> list[str]:
    return [str(e["SUMMARY"]) for e in Calendar.from_ical(text).walk() if e.name == "VEVENT"]


async def test_an_export_of_parts_is_assembled_as_one_job_renders_it(
    client: Client, database: Database, settings: Settings, conn: Connection
) -> None:
    user = await create_user(client)
    for i in range(7):
        await create_reminder(client, user["id"], message=f"r{i}", remind_in_seconds=60 * (7 - i))
    whole = await request(user["id"], part_reminders=100)
    parted = await request(user["id"], part_reminders=3)
    assert (whole.parts, parted.parts) == (0, 3)
    assert (parted.status, parted.progress) == ("pending", 0.0)
    assert (
        await conn.fetchval("SELECT count(*) FROM job WHERE job_type = 'render_export_part'") == 3
    )
    assert await conn.fetchval("SELECT count(*) FROM job_waiting WHERE job_id = $1", parted.job_id)

    async with job_state(settings) as state:
        await drain(handlers=registry, settings=settings, state=state)
    done = [await status(e.id, user["id"]) for e in (whole, parted)]
    assert [(d.status, d.progress) for d in done] == [("done", 1.0), ("done", 1.0)]
    files = [
        await conn.fetchval("SELECT content FROM exports WHERE id = $1", e.id)
        for e in (whole, parted)
    ]
    assert summaries(files[1]) == summaries(files[0]) == [f"r{i}" for i in reversed(range(7))]
    assert files[1].startswith("BEGIN:VCALENDAR")
    assert files[1].endswith("END:VCALENDAR\r\n")
    assert await conn.fetchval("SELECT count(*) FROM export_parts") == 0  # assembled, forgotten


async def test_the_status_counts_the_parts_done_and_a_failed_part_fails_the_export(
    client: Client, database: Database, settings: Settings, conn: Connection
) -> None:
    user = await create_user(client)
    for i in range(4):
        await create_reminder(client, user["id"], message=f"r{i}", remind_in_seconds=60 + i)
    export = await request(user["id"], part_reminders=2)
    # one part rendered (as its job would), the other about to fail for good
    await conn.execute(
        "INSERT INTO export_parts (export_id, part, content) VALUES ($1, 0, '')", export.id
    )
    assert (await status(export.id, user["id"])).progress == 0.5
    await conn.execute(
        "UPDATE job SET arguments = jsonb_set(arguments, '{part}', '-1'), max_retries = 0"
        " WHERE job_type = 'render_export_part' AND (arguments->>'part')::int = 1"
    )  # invalid arguments: the part goes to the dead letter
    async with job_state(settings) as state:
        await drain(
            handlers=registry,
            settings=settings.model_copy(update={"backoff_base": timedelta(0)}),
            state=state,
        )
    failed = await status(export.id, user["id"])
    assert failed.status == "failed"
    assert (failed.last_error or "").endswith("1 of 2 parts of the export failed")
