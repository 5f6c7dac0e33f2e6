"""A client generated from `/openapi.json` by openapi-python-client (the dev extra's pinned
version) drives the README's walkthrough against the app served by hypercorn, with its
in-process worker: every answer arrives as the model its operation documents, errors included
(a 404's `detail.user_id`, a 409's `detail.field`, a 422's field errors), the iCalendar file as
text, and finished jobs with the time they started. The generator must say nothing: no warning
about the document, and no model without fields."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from jobq import db
from jobq.app import create_app
from jobq.db import Database
from tests.api.conftest import ADMIN_TOKEN
from tests.conftest import make_settings
from tests.toolkit.procs import eventually
from tests.toolkit.receiver import WebhookReceiver
from tests.toolkit.served import served

PACKAGE = "jobq_generated_client"

pytestmark = pytest.mark.xdist_group("generated_client")  # one generation at a time


@pytest.fixture
async def base_url(pool_url: str, database: Database) -> AsyncIterator[str]:
    """The app served with an admin token and its own worker (the walkthrough's `make run`)."""
    settings = make_settings(
        pool_url, admin_token=ADMIN_TOKEN, run_workers=True, poll_interval=timedelta(seconds=0.2)
    )
    try:
        async with served(create_app(settings)) as url:
            yield url
    finally:
        db.bind(database)


async def generate(base_url: str, into: Path) -> tuple[Any, str]:
    """Generate the client of the served document into `into`; return its package and what the
    generator printed."""
    async with httpx.AsyncClient(base_url=base_url) as http:
        spec = (await http.get("/openapi.json")).json()
    path = into / "openapi.json"
    path.write_text(json.dumps(spec))
    tool = Path(sys.executable).parent / "openapi-python-client"
    process = await asyncio.create_subprocess_exec(
        str(tool),
        "generate",
        "--path",
        str(path),
        "--output-path",
        str(into / PACKAGE),
        "--meta",
        "none",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={"PATH": str(tool.parent)},  # its ruff, to format what it writes
    )
    output, _ = await process.communicate()
    said = output.decode()
    assert process.returncode == 0, said
    sys.path.insert(0, str(into))
    return importlib.import_module(PACKAGE), said


def op(name: str) -> Any:
    """The generated module of operation `name` (its `asyncio_detailed`)."""
    return importlib.import_module(f"{PACKAGE}.api.default.{name}")


@pytest.fixture
def unload() -> Any:
    yield
    for name in [m for m in sys.modules if m.split(".")[0] == PACKAGE]:
        del sys.modules[name]


async def test_a_generated_client_walks_through_the_readme(
    base_url: str, receiver: WebhookReceiver, tmp_path: Path, unload: None
) -> None:
    package, said = await generate(base_url, tmp_path)
    assert "warning" not in said.lower(), said
    m = importlib.import_module(f"{PACKAGE}.models")
    for name in dir(m):  # every model has fields of its own (no empty `...Arguments`)
        model = getattr(m, name)
        if hasattr(model, "from_dict"):
            fields = [f for f in model.__attrs_attrs__ if f.name != "additional_properties"]
            assert fields, name
    assert not [n for n in dir(m) if "Type1" in n or "Item" in n or "Arguments" in n]

    async with contextlib.AsyncExitStack() as clients:

        async def client(token: str | None = None) -> Any:
            """A client of the generated package (closed at the end), with `token` if any."""
            if token is None:
                made = package.Client(base_url=base_url, raise_on_unexpected_status=True)
            else:
                made = package.AuthenticatedClient(
                    base_url=base_url, token=token, raise_on_unexpected_status=True
                )
            return await clients.enter_async_context(made)

        await walk(m, await client(), await client(ADMIN_TOKEN), client, receiver)


async def walk(m: Any, anon: Any, admin: Any, client: Any, receiver: WebhookReceiver) -> None:
    """The README's walkthrough: `m` the generated models, `anon` and `admin` clients, and
    `client(token)` making a user's."""

    # a user with a webhook, and their first key
    new_ann = m.NewUser(name="Ann", email="ann@example.com", webhook_url=receiver.url + "/hook")
    created = await op("create_user").asyncio_detailed(client=anon, body=new_ann)
    assert created.status_code == 201
    ann = created.parsed
    assert isinstance(ann, m.UserWithKey)
    assert ann.api_key.startswith("jq_")
    auth = await client(ann.api_key)
    assert isinstance(await op("get_user").asyncio(client=auth, user_id=ann.id), m.User)
    missing = await op("get_user").asyncio(client=auth, user_id=ann.id + 1)
    assert isinstance(missing, m.NotFoundError)
    assert missing.detail.user_id == ann.id + 1
    # the same address again: another user (the answer tells nobody who is registered)
    again = await op("create_user").asyncio(client=anon, body=new_ann)
    assert isinstance(again, m.UserWithKey)
    assert again.id != ann.id
    invalid = await op("create_reminder").asyncio(
        client=auth, user_id=ann.id, body=m.NewReminder(message="x", remind_in_seconds=-1)
    )
    assert isinstance(invalid, m.ValidationFailed)
    assert [e.loc for e in invalid.detail] == [["remind_in_seconds"]]

    # a reminder in a second: delivered, signed; then `sent`, one delivery
    soon = await op("create_reminder").asyncio(
        client=auth, user_id=ann.id, body=m.NewReminder(message="stand up", remind_in_seconds=1)
    )
    assert soon.status == m.ReminderStatus.SCHEDULED

    async def sent() -> Any:
        got = await op("get_reminder").asyncio(client=auth, reminder_id=soon.id)
        return got if got.status == m.ReminderStatus.SENT else None

    delivered = await eventually(sent, within=30, what="the reminder sent", every=0.1)
    assert delivered.deliveries == 1
    assert [d.signed for d in receiver.deliveries[soon.id]] == [True]

    # a reminder tomorrow: its job is scheduled; deleted, the job is cancelled
    later = await op("create_reminder").asyncio(
        client=auth, user_id=ann.id, body=m.NewReminder(message="call Bob", remind_in_seconds=86400)
    )
    listed = await op("list_reminders").asyncio(client=auth, user_id=ann.id)
    assert [r.id for r in listed.reminders] == [soon.id, later.id]
    job = await op("get_job").asyncio(client=admin, job_id=later.job_id)
    assert job.state == m.JobState.SCHEDULED
    deleted = await op("delete_reminder").asyncio_detailed(client=auth, reminder_id=later.id)
    assert deleted.status_code == 204
    job = await op("get_job").asyncio(client=admin, job_id=later.job_id)
    assert job.state == m.JobState.CANCELLED

    # an iCalendar export, made by a job: waited for, then read as text
    export = await op("request_export").asyncio(client=auth, user_id=ann.id)
    assert export.status == m.ExportStatus.PENDING
    done = await op("get_export").asyncio(client=auth, export_id=export.id, wait=30)
    assert done.status == m.ExportStatus.DONE
    file = await op("download_export").asyncio(client=auth, export_id=export.id)
    assert isinstance(file, str)
    assert file.startswith("BEGIN:VCALENDAR")
    assert "SUMMARY:stand up" in file
    see = await op("get_export").asyncio_detailed(
        client=auth, export_id=export.id, accept="text/calendar"
    )
    assert see.status_code == 303
    assert see.headers["location"].endswith(f"{export.id}.ics")

    # another key; the first one revoked
    key = await op("create_key").asyncio(client=auth, user_id=ann.id)
    auth = await client(key.api_key)
    revoked = await op("revoke_key").asyncio_detailed(
        client=auth, user_id=ann.id, key_id=ann.api_key_id
    )
    assert revoked.status_code == 204

    # the queue, seen by anyone (its health), then by the admin: finished jobs say when they
    # started
    assert (await op("health").asyncio(client=anon)).status == "ok"
    assert (await op("job_stats").asyncio(client=anon)).error == "unauthorized"
    stats = await op("job_stats").asyncio(client=admin)
    assert stats.totals.dead == 0
    succeeded = await op("list_jobs").asyncio(client=admin, state=m.JobState.SUCCEEDED, limit=10)
    assert {j.job_type for j in succeeded.jobs} == {"send_reminder", "render_export"}
    for j in succeeded.jobs:
        assert j.started_at <= j.finished_at
        assert isinstance(j.arguments, dict)
    assert (await op("list_dead_jobs").asyncio(client=admin)).jobs == []
    workers = await op("list_workers").asyncio(client=admin)
    assert [w.alive for w in workers.workers] == [True]
    queues = await op("list_queues").asyncio(client=admin)
    assert "exports" in {q.name for q in queues.queues}

    # pause a queue, cancel a job that waits in it (twice: the second says so), resume
    paused = await op("pause_queue").asyncio_detailed(client=admin, name="exports")
    assert paused.status_code == 204
    waiting = await op("request_export").asyncio(client=auth, user_id=ann.id)
    cancelled = await op("cancel_job").asyncio(client=admin, job_id=waiting.job_id)
    assert (cancelled.state, cancelled.already_cancelled) == (m.JobState.CANCELLED, False)
    again = await op("cancel_job").asyncio(client=admin, job_id=waiting.job_id)
    assert (again.state, again.already_cancelled) == (m.JobState.CANCELLED, True)
    resumed = await op("resume_queue").asyncio_detailed(client=admin, name="exports")
    assert resumed.status_code == 204
