"""The commands of `python -m jobq` on the job store (see `jobq.cli`). Each takes the parsed
arguments and the settings, works on the bound `Database` through the engine's verbs, prints,
and returns its exit code; `NotFound` and `Conflict` are left to `jobq.cli.run`."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import logging
import socket
import sys
import time
from datetime import datetime, timedelta
from typing import Any

from jobq import clock, db
from jobq.cli.tables import cell, table, to_json, utc
from jobq.config import Settings
from jobq.db import Database
from jobq.errors import Conflict, NotFound
from jobq.queue import dead, limits, metrics, sql, store
from jobq.queue.control import JobState, cancel, find, list_jobs
from jobq.queue.leader.prune import BY_DAY, prune_finished
from jobq.queue.model import Job
from jobq.queue.schedule import read_schedules

OK, FAILED, USAGE, NOT_FOUND, CONFLICT = 0, 1, 2, 3, 4
"""The exit codes (2 is argparse's too: a usage error)."""

PROGRESS_EVERY_S = 1.0

audit_log = logging.getLogger("jobq.audit")


def emit(args: argparse.Namespace, data: Any, text: str) -> None:
    """Print `data` as JSON with `--json`, else `text`."""
    print(json.dumps(data, default=to_json, indent=2, ensure_ascii=False) if args.json else text)


def progress(verb: str, done: int, total: int) -> None:
    """Print `<verb> <done>/<total>` to stderr."""
    print(f"{verb} {done}/{max(done, total)}", file=sys.stderr, flush=True)


def audit(action: str, target: str) -> None:
    """Log an audit line as the HTTP admin actions do (`jobq.api.audit`), the actor being the
    user running this command."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "?"
    audit_log.info(
        "audit actor=cli:%s action=%s target=%s at=%s from=%s",
        user,
        action,
        target,
        utc(clock.now()),
        socket.gethostname(),
    )


# -- enqueue -----------------------------------------------------------------------------------


async def enqueue(args: argparse.Namespace, settings: Settings) -> int:
    """Enqueue `args.job` (its handler's queue and retries when its module is imported); a
    type that no handler of `settings.job_modules` serves is refused (exit 2) unless
    `args.force`."""
    from jobq import jobs
    from jobq.queue.registry import registry

    jobs.import_job_modules(settings)
    job: Job = args.job
    if registry.get(job.job_type) is None:
        where = ", ".join(["jobq.jobs", *settings.job_modules])
        if not args.force:
            print(
                f"jobq: no handler serves {job.job_type!r} (none in {where}; JOBQ_JOB_MODULES "
                "names more), so the job would die; --force enqueues it anyway",
                file=sys.stderr,
            )
            return USAGE
        print(f"jobq: warning: no handler for {job.job_type!r} in {where}", file=sys.stderr)
    enqueued = await store.enqueue(job)
    if enqueued.duplicate:
        text = f"job {enqueued.id}: an identical job is queued already (duplicate)"
    else:
        where = f"queue {store.queue_of(job)}, ripe {cell(job.ripe_at)}"
        text = f"job {enqueued.id} enqueued ({job.job_type}, {where})"
    emit(args, {"id": enqueued.id, "duplicate": enqueued.duplicate}, text)
    return OK


def job_of(args: argparse.Namespace) -> Job:
    """The job `enqueue` was given. Raises: `ValueError` (pydantic's `ValidationError` among
    them) for invalid arguments."""
    try:
        arguments = json.loads(args.args)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--args is not JSON: {exc}") from None
    if not isinstance(arguments, dict):
        raise ValueError("--args must be a JSON object")
    job = Job(
        job_type=args.job_type,
        arguments=arguments,
        priority=args.priority,
        max_retries=args.max_retries,
        queue=args.queue,
    )
    if args.at is not None:
        return job.runs_at(datetime.fromisoformat(args.at))
    return job.runs_in(seconds=args.in_s) if args.in_s is not None else job


# -- jobs --------------------------------------------------------------------------------------

JOB_COLUMNS = ("id", "state", "queue", "job_type", "attempts", "ripe_at", "finished_at")


async def jobs_list(args: argparse.Namespace, settings: Settings) -> int:
    """A page of jobs wherever they are, newest first (`control.list_jobs`)."""
    async with db.transaction(readonly=True) as conn:
        found = await list_jobs(
            conn,
            now=clock.now(),
            limit=args.limit,
            after=args.after,
            queue=args.queue,
            job_type=args.type,
            state=args.state,
        )
    next_after = found[-1].id if found and len(found) == args.limit else None
    rows = [j.model_dump() for j in found]
    text = table(rows, [*JOB_COLUMNS, "last_error"]) if rows else "no jobs"
    if next_after is not None:
        text += f"\n(more: --after {next_after})"
    emit(args, {"jobs": [j.model_dump(mode="json") for j in found], "next_after": next_after}, text)
    return OK


async def jobs_show(args: argparse.Namespace, settings: Settings) -> int:
    """One job with its failed attempts (`control.find`). Raises: `NotFound`."""
    async with db.transaction(readonly=True) as conn:
        job = await find(conn, args.id, now=clock.now())
    if job is None:
        raise NotFound("no such job", job_id=args.id)
    fields = job.model_dump(exclude={"failed_attempts"})
    width = max(len(k) for k in fields)
    text = "\n".join(f"{k.ljust(width)}  {cell(v, 1000)}" for k, v in fields.items())
    if job.failed_attempts:
        attempts = [a.model_dump() for a in job.failed_attempts]
        text += "\n\nfailed attempts (tracebacks: --json)\n"
        text += table(attempts, ["attempt", "worker_id", "failed_at", "error"])
    emit(args, job.model_dump(mode="json"), text)
    return OK


async def jobs_cancel(args: argparse.Namespace, settings: Settings) -> int:
    """Cancel a job whatever its state (`control.cancel`). Raises: `NotFound`, `Conflict`."""
    async with db.transaction() as conn:
        state, already = await cancel(conn, args.id, now=clock.now(), retain=settings.retain)
    if already:  # nothing changed: nothing to audit
        text = f"job {args.id} was cancelled already"
        if state is JobState.RUNNING:
            text += " (it is running: its worker was told, and it ends cancelled)"
    elif state is JobState.RUNNING:
        audit("job.cancel", f"job:{args.id}")
        text = f"job {args.id} is running: its worker was told, and it ends cancelled"
    else:
        audit("job.cancel", f"job:{args.id}")
        text = f"job {args.id} cancelled"
    emit(args, {"id": args.id, "state": state, "already_cancelled": already}, text)
    return OK


async def retry_one(args: argparse.Namespace, *, any_job: bool) -> int:
    """Retry dead job `args.id` (`dead.retry`). `any_job`: a job that exists but is not dead
    is a `Conflict` (else `NotFound`). Raises: `NotFound`, `Conflict`."""
    async with db.transaction() as conn:
        now = clock.now()
        try:
            row = await dead.retry(conn, args.id, now=now)
        except NotFound:
            if not any_job:
                raise
            job = await find(conn, args.id, now=now)
            if job is None:
                raise NotFound("no such job", job_id=args.id) from None
            raise Conflict(f"only a failed job can be retried; this one is {job.state}") from None
    audit("dead_job.retry", f"job:{args.id} ({row['job_type']})")
    emit(args, row, f"job {args.id} ({row['job_type']}) is back in the queue, attempts reset")
    return OK


async def jobs_retry(args: argparse.Namespace, settings: Settings) -> int:
    """Put a failed job back in the queue, as `POST /jobs/<id>/retry` does."""
    return await retry_one(args, any_job=True)


# -- dead --------------------------------------------------------------------------------------


async def dead_list(args: argparse.Namespace, settings: Settings) -> int:
    """A page of the dead letter, newest first (`dead.list_dead`)."""
    async with db.transaction(readonly=True) as conn:
        rows = await dead.list_dead(conn, limit=args.limit, after=args.after)
    next_after = rows[-1]["id"] if rows and len(rows) == args.limit else None
    columns = ["id", "queue", "job_type", "attempts", "died_at", "last_error"]
    text = table(rows, columns) if rows else "no dead jobs"
    if next_after is not None:
        text += f"\n(more: --after {next_after})"
    emit(args, {"jobs": rows, "next_after": next_after}, text)
    return OK


async def dead_retry(args: argparse.Namespace, settings: Settings) -> int:
    """Retry dead job `args.id`, or with `--all` every job dead when it starts, newest first,
    each in a transaction of its own, showing progress; those whose identical twin is queued
    stay (then `CONFLICT`)."""
    if not args.all:
        return await retry_one(args, any_job=False)
    database = db.current_database()
    async with database.pool.acquire() as conn:
        rows, _ = await metrics.stats(conn, now=clock.now())
        total = sum(r["dead"] for r in rows)
    retried, gone = 0, 0
    twins: list[int] = []
    after: int | None = None
    shown = time.monotonic()
    while True:
        async with database.pool.acquire() as conn:
            page = await dead.list_dead(conn, limit=500, after=after)
        if not page:
            break
        for row in page:
            try:
                async with db.transaction() as conn:
                    await dead.retry(conn, row["id"], now=clock.now())
                retried += 1
            except Conflict:
                twins.append(row["id"])
            except NotFound:
                gone += 1  # retried or discarded by someone else meanwhile
            if time.monotonic() - shown >= PROGRESS_EVERY_S:
                progress("retried", retried, total - len(twins) - gone)
                shown = time.monotonic()
        after = page[-1]["id"]
    progress("retried", retried, total - len(twins) - gone)
    audit("dead_job.retry", f"all ({retried} jobs)")
    text = f"{retried} dead jobs back in the queue"
    if twins:
        text += f"; {len(twins)} left, an identical job being queued: {cell(twins)}"
    emit(args, {"retried": retried, "twin_queued": twins}, text)
    return CONFLICT if twins else OK


async def dead_discard(args: argparse.Namespace, settings: Settings) -> int:
    """Delete a dead job for good (`dead.discard`). Raises: `NotFound`."""
    async with db.transaction() as conn:
        await dead.discard(conn, args.id)
    audit("dead_job.discard", f"job:{args.id}")
    emit(args, {"id": args.id, "discarded": True}, f"dead job {args.id} discarded")
    return OK


# -- queues, schedules -------------------------------------------------------------------------


def rate(max_starts: int | None, period: timedelta | None) -> dict[str, float] | None:
    """A rate limit as `GET /queues` gives it (None: none)."""
    if max_starts is None or period is None:
        return None
    return {"max_starts": max_starts, "period_s": period.total_seconds()}


def per(limit: dict[str, float] | None) -> str | None:
    """A rate limit in a table: `500/1s`."""
    return None if limit is None else f"{limit['max_starts']:g}/{limit['period_s']:g}s"


async def queues_list(args: argparse.Namespace, settings: Settings) -> int:
    """Every queue with its depth, running jobs, limits and paused state, as `GET /queues`."""
    async with db.transaction(readonly=True) as conn:
        rows = await limits.list_queues(conn, now=clock.now())
    queues = [
        {
            "name": r["name"],
            "paused": r["paused"],
            "ripe": r["ripe"],
            "scheduled": r["scheduled"],
            "running": r["running"],
            "max_running": r["max_running"],
            "max_running_per_key": r["max_running_per_key"],
            "rate": rate(r["rate_max_starts"], r["rate_period"]),
            "rate_per_key": rate(r["key_rate_max_starts"], r["key_rate_period"]),
        }
        for r in rows
    ]
    shown = [q | {"rate": per(q["rate"]), "rate_per_key": per(q["rate_per_key"])} for q in queues]
    emit(args, {"queues": queues}, table(shown) if shown else "no queues")
    return OK


async def queues_pause(args: argparse.Namespace, settings: Settings) -> int:
    """Pause or resume (`args.verb`) a queue for every worker (`limits.pause_queue`).
    Raises: `NotFound`."""
    paused = args.verb == "pause"
    async with db.transaction() as conn:
        if not await limits.pause_queue(conn, args.name, paused=paused):
            raise NotFound("no such queue", queue=args.name)
    audit(f"queue.{args.verb}", f"queue:{args.name}")
    text = f"queue {args.name} {'paused' if paused else 'resumed'}"
    emit(args, {"name": args.name, "paused": paused}, text)
    return OK


async def schedules_list(args: argparse.Namespace, settings: Settings) -> int:
    """Every schedule (`read_schedules`)."""
    async with db.transaction(readonly=True) as conn:
        rows = await read_schedules(conn)
    emit(args, {"schedules": rows}, table(rows) if rows else "no schedules")
    return OK


# -- prune, stats ------------------------------------------------------------------------------


async def day_partitions(database: Database) -> set[str]:
    """The names of the day partitions of the tables the pruner prunes."""
    async with database.pool.acquire() as conn:
        return {
            r["relname"]
            for table in BY_DAY
            for r in await sql.job_day_partitions.fetch(conn, parent=table)
        }


async def prune(args: argparse.Namespace, settings: Settings) -> int:
    """One round of retention (`prune_finished`), as the leader's pruner does, with
    `--retention-s` or the settings' retention; its elapsed time on stderr every second."""
    database = db.current_database()
    retention = (
        settings.retention if args.retention_s is None else timedelta(seconds=args.retention_s)
    )
    now = clock.now()
    before = await day_partitions(database)
    print(f"pruning jobs finished before {utc(now - retention)}", file=sys.stderr, flush=True)
    started = time.monotonic()
    task = asyncio.create_task(prune_finished(database, now=now, retention=retention))
    while not task.done():
        await asyncio.wait([task], timeout=PROGRESS_EVERY_S)
        if not task.done():
            print(f"pruning: {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    rows = task.result()
    after = await day_partitions(database)
    dropped, made = sorted(before - after), sorted(after - before)
    result = {
        "cutoff": now - retention,
        "dropped_partitions": dropped,
        "made_partitions": made,
        "deleted_rows": rows,
    }
    text = (
        f"pruned: {len(dropped)} day partitions dropped {cell(dropped)}, {rows} rows deleted"
        f" from the default partitions, {len(made)} partitions made ahead"
    )
    emit(args, result, text)
    return OK


async def stats(args: argparse.Namespace, settings: Settings) -> int:
    """Counts per job type and the vacuum figures, as `GET /jobs/stats` gives them."""
    async with db.transaction(readonly=True) as conn:
        now = clock.now()
        rows, counted_at = await metrics.stats(conn, now=now)
        vacuum = await metrics.vacuum_stats(conn, now=now)
    counts = ("ripe", "scheduled", "running", "dead")
    totals = {"job_type": "*", **{c: sum(r[c] for r in rows) for c in counts}}
    oldest = vacuum["oldest_transaction_s"]
    text = "\n".join(
        [
            table([*rows, totals], ["job_type", *counts]),
            *(
                []
                if counted_at is None
                else [f"queued jobs as counted at {counted_at:%Y-%m-%d %H:%M:%S}Z"]
            ),
            "",
            f"oldest open transaction: {'none' if oldest is None else f'{oldest:.1f} s'}",
            table(vacuum["tables"]),
        ]
    )
    body = {"job_types": rows, "totals": totals, "queued_counted_at": counted_at, "vacuum": vacuum}
    emit(args, body, text)
    return OK
