"""`python -m jobq <command>`: the job store from a shell, for operators and scripts.

    enqueue JOB_TYPE [--args JSON] [--queue Q] [--in SECONDS | --at ISO] [--priority N]
                     [--max-retries N] [--force]
    jobs list [--queue Q] [--type T] [--state S] [--limit N] [--after ID]
    jobs show ID | jobs cancel ID | jobs retry ID
    dead list [--limit N] [--after ID] | dead retry (ID | --all) | dead discard ID
    queues list | queues pause NAME | queues resume NAME
    schedules list
    workers
    top [--interval S] [--once]
    workflows [--unfinished] [--limit N] [--after ID]
    workflow ID [--cancel | --retry]
    prune [--retention-s S]
    stats

Each prints a readable table, or with `--json` one JSON document on stdout (times ISO 8601 UTC
with `Z`, durations in seconds). Errors go to stderr as `jobq: <message>`; progress too (`dead
retry --all`, `prune`). The database is the settings' (`DATABASE_URL`, else the embedded
server), as for `python -m jobq check`; no migration is applied.

Exit codes: 0 done; 1 failed (invalid settings, database unreachable or unmigrated, a database
error); 2 usage error (with a usage line); 3 not found (no such job, dead job or queue); 4
conflict (the job's state forbids it: cancel a finished job, retry a job that is not failed or
whose identical twin is queued; `dead retry --all` when it left some for that reason).

Each change is one short transaction through the engine's own verbs (`jobq.queue.control`,
`.dead`, `.store`, `.leader.prune`), and the admin actions are logged on `jobq.audit` like the
HTTP ones, with `actor=cli:<user>`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import asyncpg
from pydantic import ValidationError

from jobq import db, embedded
from jobq.cli import commands, fleet, workflows
from jobq.cli.commands import CONFLICT, FAILED, NOT_FOUND
from jobq.cli.help import SUMMARY, description, epilog
from jobq.config import Settings
from jobq.db import Database
from jobq.errors import Conflict, DuplicateJob, JobqError, NotFound
from jobq.migrate import session
from jobq.queue.control import JobState

COMMANDS = (
    "enqueue",
    "jobs",
    "dead",
    "queues",
    "schedules",
    "workers",
    "top",
    "prune",
    "stats",
    *workflows.COMMANDS,
)
"""The first words of the job store's commands (this package runs them)."""

PROCESSES = ("run", "serve", "worker", "migrate", "check", "db-stop", "sql")
"""The first words of the commands that `jobq.__main__` runs itself."""

Command = Callable[[argparse.Namespace, Settings], Awaitable[int]]


def parser() -> argparse.ArgumentParser:
    """The parser of every command; each sets `command_parser` (its own parser, whose
    `error()` prints its usage line and exits 2), and those of the job store `run` (its
    `Command`). Each command's `--help` has its description and examples (`jobq.cli.help`)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one JSON document")
    top = argparse.ArgumentParser(
        prog="python -m jobq",
        description="The jobq service (run, serve, worker, migrate, check, ...) and its job "
        "store (enqueue, jobs, dead, queues, workers, top, ...), from a shell.",
        epilog="each command has its own help: python -m jobq COMMAND --help",
    )
    first = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(group: Any, name: str, *, key: str = "", **kw: Any) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = group.add_parser(
            name,
            help=SUMMARY[key or name],
            description=description(key or name),
            epilog=epilog(key or name),
            formatter_class=argparse.RawDescriptionHelpFormatter,
            **kw,
        )
        sub.set_defaults(command_parser=sub)
        return sub

    def leaf(group: Any, name: str, run: Command, help: str, key: str) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = group.add_parser(
            name,
            parents=[common],
            help=help,
            description=help[0].upper() + help[1:] + ".",
            epilog=epilog(key),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        sub.set_defaults(run=run, command_parser=sub)
        return sub

    def page(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--limit", type=positive, default=100, help="at most this many")
        sub.add_argument("--after", type=positive, help="ids below this one (the next page)")

    for name in PROCESSES:
        sub = command(first, name)
        if name == "serve":
            sub.add_argument("--fd", type=int, help="accept on this inherited socket (run's)")
        elif name == "check":
            sub.add_argument(
                "--rescue-grace-s",
                type=float,
                default=60.0,
                help="how long a job of a dead or hung worker may await its rescue (seconds)",
            )
        elif name == "sql":
            sub.add_argument("name", nargs="?", help="the statement to print whole")

    sub = command(first, "enqueue", parents=[common])
    sub.set_defaults(run=commands.enqueue)
    sub.add_argument("job_type")
    sub.add_argument("--args", default="{}", metavar="JSON", help="its arguments, an object")
    sub.add_argument("--queue", help="default: its handler's")
    when = sub.add_mutually_exclusive_group()
    when.add_argument("--in", dest="in_s", type=float, metavar="SECONDS", help="ripe in")
    when.add_argument("--at", metavar="ISO", help="ripe at (ISO 8601, with Z or an offset)")
    sub.add_argument("--priority", type=int, default=0, metavar="N", help="higher runs first")
    sub.add_argument("--max-retries", type=int, metavar="N", help="default: its handler's")
    sub.add_argument(
        "--force", action="store_true", help="enqueue even when no handler serves its type here"
    )

    verbs = command(first, "jobs").add_subparsers(dest="verb", required=True, metavar="VERB")
    sub = leaf(verbs, "list", commands.jobs_list, "jobs, newest first", "jobs")
    sub.add_argument("--queue")
    sub.add_argument("--type", help="job type")
    sub.add_argument("--state", choices=[s.value for s in JobState])
    page(sub)
    for name, run, help in (
        ("show", commands.jobs_show, "one job, with its failed attempts"),
        ("cancel", commands.jobs_cancel, "cancel a job whatever its state"),
        ("retry", commands.jobs_retry, "put a failed job back in the queue"),
    ):
        leaf(verbs, name, run, help, "jobs").add_argument("id", type=positive)

    verbs = command(first, "dead").add_subparsers(dest="verb", required=True, metavar="VERB")
    page(leaf(verbs, "list", commands.dead_list, "dead jobs, newest first", "dead"))
    sub = leaf(verbs, "retry", commands.dead_retry, "back to the queue, attempts reset", "dead")
    which = sub.add_mutually_exclusive_group(required=True)
    which.add_argument("id", type=positive, nargs="?")
    which.add_argument("--all", action="store_true", help="every dead job")
    sub = leaf(verbs, "discard", commands.dead_discard, "delete a dead job for good", "dead")
    sub.add_argument("id", type=positive)

    verbs = command(first, "queues").add_subparsers(dest="verb", required=True, metavar="VERB")
    leaf(verbs, "list", commands.queues_list, "depth, running, limits, paused", "queues")
    for name, help in (("pause", "no worker claims its jobs"), ("resume", "claim them again")):
        leaf(verbs, name, commands.queues_pause, help, "queues").add_argument("name")

    verbs = command(first, "schedules").add_subparsers(dest="verb", required=True, metavar="VERB")
    leaf(verbs, "list", commands.schedules_list, "every schedule, all its columns", "schedules")

    command(first, "workers", parents=[common]).set_defaults(run=fleet.workers)
    sub = command(first, "top")
    sub.set_defaults(run=fleet.top)
    sub.add_argument("--interval", type=float, default=2.0, metavar="S", help="seconds (>= 0.2)")
    sub.add_argument("--once", action="store_true", help="print one frame and exit")

    workflows.add_commands(first, leaf, page, positive)

    sub = command(first, "prune", parents=[common])
    sub.set_defaults(run=commands.prune)
    sub.add_argument(
        "--retention-s", type=float, metavar="S", help="seconds (default: JOBQ_RETENTION_S)"
    )
    command(first, "stats", parents=[common]).set_defaults(run=commands.stats)
    return top


def positive(value: str) -> int:
    """An argument that is a whole number >= 1. Raises: `argparse.ArgumentTypeError`."""
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number >= 1")
    return int(value)


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """Parse a command; on a usage error print the usage line and the error, and exit 2."""
    args = parser().parse_args(argv)
    if args.command == "enqueue":
        try:
            args.job = commands.job_of(args)
        except ValidationError as exc:
            error = exc.errors()[0]
            args.command_parser.error(f"{'.'.join(map(str, error['loc']))}: {error['msg']}")
        except ValueError as exc:  # not JSON, a naive or malformed --at
            args.command_parser.error(str(exc))
    return args


async def run(args: argparse.Namespace, settings: Settings) -> int:
    """Run the parsed command on the settings' database and return its exit code."""
    try:
        dsn = await embedded.resolve_dsn(settings)
        await (await session(settings, dsn)).close()  # no transaction pooler in the way
        database = await Database.open(settings, dsn)
    except (OSError, asyncpg.PostgresError) as exc:
        print(f"jobq: cannot reach the database ({type(exc).__name__}: {exc})", file=sys.stderr)
        return FAILED
    db.bind(database)
    try:
        code: int = await args.run(args, settings)
        return code
    except NotFound as exc:
        return fail(exc, NOT_FOUND)
    except (Conflict, DuplicateJob) as exc:
        return fail(exc, CONFLICT)
    except JobqError as exc:
        return fail(exc, FAILED)
    except asyncpg.UndefinedTableError as exc:
        print(f"jobq: {exc} (python -m jobq migrate applies the migrations)", file=sys.stderr)
        return FAILED
    except (OSError, asyncpg.PostgresError) as exc:
        print(f"jobq: {type(exc).__name__}: {exc}", file=sys.stderr)
        return FAILED
    finally:
        await database.close()


def fail(exc: JobqError, code: int) -> int:
    """Print `exc` (its message, then its data) to stderr; return `code`."""
    data = ", ".join(f"{k}={v}" for k, v in exc.data.items())
    print(f"jobq: {exc.message}" + (f" ({data})" if data else ""), file=sys.stderr)
    return code
