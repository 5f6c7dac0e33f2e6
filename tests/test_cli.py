"""`python -m jobq enqueue | jobs | dead | queues | schedules | prune | stats` (`jobq.cli`) on the
session's database: their tables and `--json`, their exit codes (0 done, 2 usage, 3 not found, 4
conflict), and what they change in the database.

The commands run in this process, parsed and run by the program's own `jobq.cli.parse` and
`jobq.cli.run` (a process start is most of a command's cost); a run given an environment
(`JOBQ_LOG_FORMAT`, for the audit log on stderr) is the program itself, `python -m jobq`, as a
real subprocess."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from jobq import cli, clock
from jobq.__main__ import main
from jobq.cli.commands import JOB_COLUMNS
from jobq.cli.fleet import WORKER_COLUMNS
from jobq.cli.tables import table, utc
from jobq.config import PROJECT_ROOT
from jobq.db import Connection, Database
from jobq.queue import Job, Registry, enqueue
from jobq.queue.schedule import read_schedules
from tests.conftest import make_settings
from tests.toolkit.procs import subprocess_env


@dataclass
class Ran:
    """What a `python -m jobq ...` run printed, and its exit code."""

    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


Jobq = Callable[..., Awaitable[Ran]]


async def run_jobq(database_url: str, *args: str, env: Mapping[str, str] = {}) -> Ran:
    """Run `python -m jobq <args>` on the database of `database_url`."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "jobq",
        *args,
        cwd=PROJECT_ROOT,
        env=subprocess_env(database_url, env),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode is not None
    return Ran(process.returncode, out.decode(), err.decode())


async def run_in_process(database_url: str, *args: str) -> Ran:
    """Run `python -m jobq <args>` as the program does after reading its settings (`cli.parse`,
    then `cli.run`), in a task of its own (its `db.bind` stays there), on the database of
    `database_url`, with what it prints captured."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            parsed = cli.parse(list(args))
        except SystemExit as exc:  # a usage error: the usage line is printed
            code = exc.code if isinstance(exc.code, int) else 1
        else:
            code = await asyncio.create_task(cli.run(parsed, make_settings(database_url)))
    return Ran(code, out.getvalue(), err.getvalue())


@pytest.fixture
def jobq(database: Database, database_url: str) -> Jobq:
    """Runs `python -m jobq <args>` on the test database (emptied for this test): in this
    process (`run_in_process`), or, given an `env` (which may be empty), as the program itself in
    a subprocess with that environment."""

    async def run(*args: str, env: Mapping[str, str] | None = None) -> Ran:
        if env is not None:
            return await run_jobq(database_url, *args, env=env)
        return await run_in_process(database_url, *args)

    return run


async def insert_dead(conn: Connection, job_id: int, arguments: dict[str, Any]) -> None:
    await conn.execute(
        "INSERT INTO job_dead (id, job_type, arguments, priority, attempts, max_retries,"
        " last_error, created_at, died_at) VALUES ($1, 'cli.test', $2, 0, 3, 2, 'boom', $3, $3)",
        job_id,
        arguments,
        clock.now(),
    )


async def test_enqueue_prints_the_id_and_whether_it_was_a_duplicate(
    jobq: Jobq, conn: Connection
) -> None:
    before = clock.now()
    refused = await jobq("enqueue", "cli.test", "--args", '{"n": 1}')
    assert refused.code == 2
    assert refused.err.startswith("jobq: no handler serves 'cli.test'")
    assert "--force" in refused.err
    assert await conn.fetchval("SELECT count(*) FROM job") == 0
    ran = await jobq(
        "enqueue",
        *("cli.test", "--args", '{"n": 1}', "--in", "60", "--priority", "3"),
        *("--json", "--force"),
    )
    after = clock.now()
    assert ran.code == 0, ran.err
    job_id = ran.json()["id"]
    assert ran.json() == {"id": job_id, "duplicate": False}
    row = await conn.fetchrow("SELECT priority, ripe_at FROM job")
    assert row is not None
    assert row["priority"] == 3
    # 60 s after the command read its clock, which it did while it ran
    assert before + timedelta(seconds=60) <= row["ripe_at"] <= after + timedelta(seconds=60)

    again = await jobq("enqueue", "cli.test", "--args", '{"n": 1}', "--in", "120", "--force")
    assert again.code == 0
    assert again.out == f"job {job_id}: an identical job is queued already (duplicate)\n"
    assert "no handler for 'cli.test'" in again.err

    listed = await jobq("jobs", "list")
    header, line = listed.out.splitlines()
    assert header.split() == [*JOB_COLUMNS, "last_error"]
    assert line.split()[:5] == [str(job_id), "scheduled", "default", "cli.test", "0"]

    shown = await jobq("jobs", "show", str(job_id), "--json")
    assert shown.code == 0
    assert shown.json()["state"] == "scheduled"
    assert shown.json()["arguments"] == {"n": 1}
    assert shown.json()["priority"] == 3


async def test_unknown_ids_exit_3_and_bad_arguments_exit_2_with_a_usage_line(jobq: Jobq) -> None:
    missing = await jobq("jobs", "show", "424242", "--json", env={})  # the program itself
    assert (missing.code, missing.out) == (3, "")
    assert missing.err == "jobq: no such job (job_id=424242)\n"
    assert (await jobq("dead", "retry", "424242")).code == 3

    bad_state = await jobq("jobs", "list", "--state", "lost", env={})
    assert bad_state.code == 2
    assert bad_state.err.startswith("usage: python -m jobq jobs list")
    bad_args = await jobq("enqueue", "cli.test", "--args", "[1]")
    assert bad_args.code == 2
    assert bad_args.err.startswith("usage: python -m jobq enqueue")
    assert bad_args.err.endswith("error: --args must be a JSON object\n")


async def test_cancel_then_a_retry_of_the_cancelled_job_is_a_conflict(
    jobq: Jobq, database: Database, conn: Connection
) -> None:
    job_id = (await enqueue(Job(job_type="cli.test", arguments={"n": 2}))).id

    cancelled = await jobq("jobs", "cancel", str(job_id), env={"JOBQ_LOG_FORMAT": "json"})
    assert cancelled.code == 0
    assert cancelled.out == f"job {job_id} cancelled\n"
    assert await conn.fetchval("SELECT state FROM job_done WHERE id = $1", job_id) == "cancelled"
    audit = json.loads(cancelled.err.splitlines()[-1])  # the log, as JSON lines
    assert audit["logger"] == "jobq.audit"
    assert f"action=job.cancel target=job:{job_id}" in audit["message"]

    again = await jobq("jobs", "cancel", str(job_id), "--json", env={"JOBQ_LOG_FORMAT": "json"})
    assert again.code == 0
    assert again.json() == {"id": job_id, "state": "cancelled", "already_cancelled": True}
    assert "jobq.audit" not in again.err  # nothing changed: nothing audited
    said = await jobq("jobs", "cancel", str(job_id))
    assert said.out == f"job {job_id} was cancelled already\n"

    refused = await jobq("jobs", "retry", str(job_id))
    assert refused.code == 4
    assert "only a failed job can be retried; this one is cancelled" in refused.err


async def test_pause_and_resume_a_queue(jobq: Jobq, conn: Connection) -> None:
    paused = "SELECT paused FROM job_queue WHERE name = 'default'"
    assert (await jobq("queues", "pause", "default")).code == 0
    assert await conn.fetchval(paused) is True

    listed = await jobq("queues", "list", "--json")
    assert [(q["name"], q["paused"]) for q in listed.json()["queues"]] == [("default", True)]

    assert (await jobq("queues", "resume", "default")).code == 0
    assert await conn.fetchval(paused) is False
    unknown = await jobq("queues", "pause", "nowhere")
    assert (unknown.code, unknown.err) == (3, "jobq: no such queue (queue=nowhere)\n")


async def test_dead_retry_moves_jobs_back_and_all_reports_progress(
    jobq: Jobq, conn: Connection
) -> None:
    for job_id in (11, 12, 13):
        await insert_dead(conn, job_id, {"n": job_id})
    await enqueue(Job(job_type="cli.test", arguments={"n": 13}))  # 13's twin is queued

    listed = await jobq("dead", "list")
    assert [line.split()[0] for line in listed.out.splitlines()] == ["id", "13", "12", "11"]

    one = await jobq("dead", "retry", "11", "--json")
    assert one.code == 0
    assert (one.json()["id"], one.json()["attempts"]) == (11, 0)
    assert await conn.fetchval("SELECT count(*) FROM job WHERE id = 11") == 1

    every = await jobq("dead", "retry", "--all")
    assert every.code == 4  # 13 stays: an identical job is queued
    assert "retried 1/1\n" in every.err
    assert every.out.startswith("1 dead jobs back in the queue; 1 left")
    assert [r["id"] for r in await conn.fetch("SELECT id FROM job_dead")] == [13]
    assert await conn.fetchval("SELECT attempts FROM job WHERE id = 12") == 0


async def test_prune_deletes_finished_jobs_past_the_retention(jobq: Jobq, conn: Connection) -> None:
    long_ago = clock.now() - timedelta(days=30)  # no partition of its own: the default one
    await conn.execute(
        "INSERT INTO job_done (id, job_type, queue, arguments, state, attempts, created_at,"
        " finished_at) VALUES (21, 'cli.test', 'default', '{}', 'succeeded', 1, $1, $1)",
        long_ago,
    )
    ran = await jobq("prune", "--json")
    assert ran.code == 0, ran.err
    assert ran.json()["deleted_rows"] == 1
    assert ran.err.startswith("pruning jobs finished before ")
    assert await conn.fetchval("SELECT count(*) FROM job_done") == 0


async def test_stats_and_schedules(jobq: Jobq, database: Database) -> None:
    await enqueue(Job(job_type="cli.test", arguments={"n": 3}))
    ran = await jobq("stats")
    assert ran.code == 0
    lines = ran.out.splitlines()
    assert lines[0].split() == ["job_type", "ripe", "scheduled", "running", "dead"]
    assert lines[1].split() == ["cli.test", "1", "0", "0", "0"]
    assert lines[2].split() == ["*", "1", "0", "0", "0"]

    schedules = await jobq("schedules", "list")  # none declared (or no table yet)
    assert (schedules.code, schedules.out) == (0, "no schedules\n")


async def test_schedules_are_listed_with_all_their_columns(conn: Connection) -> None:
    # A temporary table comes first in the search path: this one, whatever the real one is.
    await conn.execute(
        "CREATE TEMP TABLE job_schedule (name text, every_s float, next_at timestamptz)"
    )
    next_at = clock.now()
    await conn.execute("INSERT INTO job_schedule VALUES ('nightly', 86400, $1)", next_at)
    rows = await read_schedules(conn)
    assert rows == [{"name": "nightly", "every_s": 86400.0, "next_at": next_at}]
    header, line = table(rows).splitlines()
    assert header.split() == ["name", "every_s", "next_at"]
    assert line.split() == ["nightly", "86400.0", utc(next_at.replace(microsecond=0))]


def test_tables_align_cut_long_cells_and_show_none() -> None:
    rows = [{"id": 7, "error": "x" * 100, "at": None}, {"id": 12, "error": "a\nb", "at": None}]
    assert table(rows).splitlines() == [
        "id  error" + " " * 57 + "at",
        " 7  " + "x" * 59 + "…  -",
        "12  a b" + " " * 59 + "-",
    ]


COMMANDS = [
    *("run", "serve", "worker", "migrate", "check", "db-stop", "sql", "enqueue", "jobs"),
    *("jobs list", "jobs cancel", "dead", "dead retry", "queues", "queues pause"),
    *("schedules", "workers", "top", "prune", "stats"),
]


def help_of(*command: str, capsys: pytest.CaptureFixture[str]) -> str:
    """What `python -m jobq <command> --help` prints, parsed in this process as the program
    parses it (`jobq.__main__.main`), once checked to exit 0."""
    with pytest.raises(SystemExit) as exited:
        main([*command, "--help"])
    assert exited.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_its_own_help_with_examples(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    overall = help_of(capsys=capsys)
    out = help_of(*command.split(), capsys=capsys)
    assert out.startswith(f"usage: python -m jobq {command}"), out
    examples = out[out.index("\nexamples:\n") :]
    assert f"python -m jobq {command.split()[0]}" in examples
    assert out.count("\n") > 6  # a description, not the global text
    assert out != overall


async def test_workers_lists_the_registered_workers(
    jobq: Jobq, conn: Connection, make_worker: Any
) -> None:
    assert (await jobq("workers")).out == "no workers registered\n"
    worker = await make_worker(Registry())
    ran = await jobq("workers", "--json")
    assert ran.code == 0, ran.err
    [row] = ran.json()["workers"]
    assert (row["id"], row["alive"], row["running_jobs"]) == (worker.id, True, 0)
    header, line = (await jobq("workers")).out.splitlines()
    assert header.split() == list(WORKER_COLUMNS)
    assert line.split()[0] == str(worker.id)
