"""`python -m jobq run | serve | worker | migrate | check | db-stop | sql`, and the job store's
commands: `enqueue`, `jobs`, `dead`, `queues`, `schedules`, `workflows`, `workflow`, `prune`,
`stats` (`jobq.cli`)."""

from __future__ import annotations

import signal
import sys
import threading

_stop_requested = threading.Event()
"""Set by a SIGTERM/SIGINT that arrives while the process is still starting (before its event
loop's handlers exist): `run`'s supervisor may stop a child that has not finished starting,
and that child must then stop cleanly (exit 0), not die of the signal."""


def _note_stop(_signum: int, _frame: object) -> None:
    _stop_requested.set()


if __name__ == "__main__" and sys.argv[1:2] in (["serve"], ["worker"]):
    # First thing, before the imports below (they take a while): a child stopped while it
    # imports (a worker respawned just before the end) would die of the signal (exit -15)
    # instead of stopping.
    for _sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(_sig, _note_stop)

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

from pydantic import ValidationError

from jobq import cli, logs
from jobq.config import Settings
from jobq.queue.slots import ConfigError

T = TypeVar("T")


def _signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if _stop_requested.is_set():
        stop.set()


async def serve(settings: Settings, fd: int | None = None) -> None:
    """Serve the API with hypercorn (and, unless JOBQ_RUN_WORKERS=false, a worker) until
    SIGTERM/SIGINT; then stop gracefully. `fd`: a listening socket to accept on (inherited
    from `run`'s supervisor) instead of binding the settings' address."""
    from jobq import embedded
    from jobq.migrate import session

    # First (before the app's imports, and before hypercorn, whose failed startup would say
    # less): no transaction pooler in the way.
    await (await session(settings, await embedded.resolve_dsn(settings))).close()
    from jobq.app import create_app

    await serve_app(create_app(settings), settings, fd)


def http_config(settings: Settings) -> Any:
    """Hypercorn's `Config` for the settings (its `bind` left to the caller): the drain and
    shutdown timeouts, the loggers, and the deadlines of a request's parts. A connection must
    send a request's headers within `HEADER_TIMEOUT_S` of its opening (or of the previous
    answer: hypercorn's keep-alive timeout), or it is closed; the body has
    `JOBQ_BODY_TIMEOUT_S` from there (the app's, `jobq.app`); a header block is at most
    `MAX_HEADER_BYTES`."""
    from hypercorn.config import Config

    config = Config()
    config.graceful_timeout = settings.drain_timeout.total_seconds()
    config.keep_alive_timeout = HEADER_TIMEOUT_S
    config.h11_max_incomplete_size = MAX_HEADER_BYTES
    # Hypercorn's loggers propagate to ours: one format, no duplicated lines.
    access = logging.getLogger("hypercorn.access")
    # Hypercorn builds each access record (the whole environ included) before the logger's
    # level is checked: ~0.5 ms per request. Log access only when INFO is on.
    config.accesslog = access if access.isEnabledFor(logging.INFO) else None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.shutdown_timeout = settings.drain_timeout.total_seconds() + 10
    return config


HEADER_TIMEOUT_S = 5
"""How long a connection may take to send a request's headers (hypercorn's default)."""
MAX_HEADER_BYTES = 16 * 1024
"""The largest request line and headers hypercorn reads (h11's limit; its default)."""


async def serve_app(app: Any, settings: Settings, fd: int | None = None) -> None:
    """Serve the ASGI `app` with hypercorn (`http_config`) on `settings.http_host:http_port`
    (or the listening socket `fd`) until SIGTERM/SIGINT, then shut it down: requests in
    progress get the drain timeout, the app's own stop (its worker's drain) the drain timeout
    plus 10 s. At the signal, the requests that wait on a job (`?wait=`) answer at once with
    the job as it is (`jobq.queue.control.drain_waits`)."""
    from hypercorn.asyncio import serve as hypercorn_serve

    from jobq.queue.control import drain_waits

    config = http_config(settings)
    config.bind = [f"fd://{fd}" if fd is not None else f"{settings.http_host}:{settings.http_port}"]
    stop = asyncio.Event()
    _signals(stop)

    async def shutdown() -> None:
        await stop.wait()
        drain_waits()

    await hypercorn_serve(app, config, shutdown_trigger=shutdown)


def supervise(settings: Settings) -> int:
    """`run`: apply the migrations, bind the HTTP sockets, then supervise the web and worker
    processes (`jobq.supervisor`) until SIGTERM/SIGINT; return the exit code."""
    from jobq.migrate import prepare
    from jobq.supervisor import Supervisor, bind, web_processes

    dsn = run(prepare(settings))
    sockets = bind(settings, web_processes(settings))
    try:
        log = logging.getLogger("jobq.supervisor")
        log.info("listening on http://%s:%d", *sockets[0].getsockname()[:2])
        return Supervisor(settings, dsn, [sock.fileno() for sock in sockets]).run()
    finally:
        for sock in sockets:
            sock.close()


async def work(settings: Settings) -> None:
    """Run one worker process until SIGTERM/SIGINT; then stop gracefully."""
    from jobq import jobs
    from jobq.db import Database
    from jobq.migrate import prepare
    from jobq.queue import Worker

    dsn = await prepare(settings)
    # A floor of one pooled connection (the web's JOBQ_MIN_POOL_SIZE is for requests): the
    # heartbeats use it, and it is the session of this process that keeps its jobs while its
    # listener alone reconnects (`job_workers_alive`); handlers open more as they need.
    database = await Database.open(settings, dsn, min_size=1)
    try:
        async with jobs.job_state(settings) as state:
            worker = Worker(database, settings, state=state)
            stop = asyncio.Event()
            _signals(stop)
            await worker.run(stop)
    finally:
        await database.close()


async def migrate(settings: Settings) -> None:
    """Apply the migrations and print the database they went to (without its password)."""
    from jobq.migrate import prepare

    await prepare(settings)
    print("migrations applied")


async def check(settings: Settings, rescue_grace_s: float) -> int:
    """Verify the queue's invariants (`jobq.check`), print the report as JSON, and return the
    exit code: 1 when an invariant fails, else 0. Reads only; applies no migration."""
    from datetime import timedelta

    from jobq import clock, embedded
    from jobq.check import check as check_queue
    from jobq.migrate import session

    conn = await session(settings, await embedded.resolve_dsn(settings))
    try:
        report = await check_queue(
            conn,
            now=clock.now(),
            heartbeat_grace=settings.heartbeat_grace,
            rescue_grace=timedelta(seconds=rescue_grace_s),
        )
    finally:
        await conn.close()
    print(report.model_dump_json(indent=2))
    return 0 if report.ok else 1


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` to completion on uvloop (libuv's event loop: less CPU per job than asyncio's
    own) where it is installed, else on asyncio's."""
    try:
        import uvloop
    except ImportError:  # not on Windows
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


def print_statement(name: str | None) -> int:
    """Without `name`, print every statement's name, one per line; with it, print that
    statement whole (its comment, then its text as written in `sql/queries/`) and its
    parameters in the order PostgreSQL receives them. An unknown name prints the names to
    stderr and returns 2."""
    from jobq.statements import STATEMENTS

    if name is None:
        print("\n".join(STATEMENTS))
        return 0
    query = STATEMENTS.get(name)
    if query is None:
        print(f"no statement named {name!r}; one of:\n" + "\n".join(STATEMENTS), file=sys.stderr)
        return 2
    if query.doc:
        print("\n".join(f"-- {line}".rstrip() for line in query.doc.splitlines()))
    print(query.source.strip() + ";")
    print("-- " + ", ".join(f"${i} :{param}" for i, param in enumerate(query.params, 1)))
    return 0


def _check_queues(settings: Settings) -> None:
    """Import the handlers, declare the queues, and check `JOBQ_QUEUES` against them.
    Raises: `ConfigError`, `ImportError`, `ValueError` (a malformed declaration)."""
    from jobq import jobs
    from jobq.queue.registry import registry
    from jobq.queue.slots import served_queues

    jobs.import_job_modules(settings)
    jobs.declare_queues(settings)
    served_queues(settings, registry)


def _one_line(exc: Exception) -> str:
    """A start-up error as one line: each invalid setting by its environment name (a rule
    between settings names them in its message)."""
    if isinstance(exc, ValidationError):
        return "; ".join(_invalid(e["loc"], e["msg"]) for e in exc.errors())
    return str(exc)


def _invalid(loc: tuple[int | str, ...], msg: str) -> str:
    msg = msg.removeprefix("Value error, ")
    if not loc:
        return f"invalid settings: {msg}"
    name = str(loc[0])
    return f"invalid setting {name if name.isupper() else f'JOBQ_{name.upper()}'}: {msg}"


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    argv = sys.argv[1:] if argv is None else argv
    args = cli.parse(argv)
    command = args.command
    store_command = command in cli.COMMANDS
    if command in ("serve", "worker"):
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, _note_stop)
    if command == "sql":
        return print_statement(args.name)
    try:
        settings = Settings()
        if command in ("serve", "worker"):
            _check_queues(settings)
    except (ValidationError, ConfigError, ImportError, ValueError) as exc:
        print(f"jobq: {_one_line(exc)}", file=sys.stderr)
        return 1
    logs.configure(settings.log_level, settings.log_format)
    logging.getLogger("pgserver").setLevel(logging.WARNING)  # its INFO is initdb chatter
    if command == "db-stop":
        from jobq import embedded

        stopped = embedded.stop(settings.pgdata_dir)
        print("embedded PostgreSQL stopped" if stopped else "embedded PostgreSQL was not running")
        return 0
    from jobq.migrate import PreBaselineDatabase
    from jobq.pooler import TransactionPooler

    if command == "run":  # the kept webhook secret is made once, before the children start
        from jobq.domain.signing import with_secret

        try:
            settings = with_secret(settings)
        except (ValueError, OSError) as exc:
            print(f"jobq: {exc}", file=sys.stderr)
            return 1
    try:
        if command == "check":
            return run(check(settings, args.rescue_grace_s))
        if store_command:
            return run(cli.run(args, settings))
        if command == "run":
            code = supervise(settings)
        elif command == "serve":
            run(serve(settings, args.fd))
            code = 0
        else:
            run({"worker": work, "migrate": migrate}[command](settings))
            code = 0
    except (PreBaselineDatabase, TransactionPooler) as exc:
        print(f"jobq: {exc}", file=sys.stderr)
        return 1
    if settings.database_url is None:
        logging.getLogger("jobq").info("embedded PostgreSQL left running (make db-stop stops it)")
    return code


if __name__ == "__main__":
    sys.exit(main())
