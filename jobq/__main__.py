"""`python -m jobq serve | worker | migrate | check | db-stop`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

from jobq.config import Settings

T = TypeVar("T")


def _signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


async def serve(settings: Settings) -> None:
    """Serve the API with hypercorn (and, unless JOBQ_RUN_WORKERS=false, a worker) until
    SIGTERM/SIGINT; then stop gracefully."""
    from jobq.app import create_app

    await serve_app(create_app(settings), settings)


async def serve_app(app: Any, settings: Settings) -> None:
    """Serve the ASGI `app` with hypercorn on `settings.http_host:http_port` until
    SIGTERM/SIGINT, then shut it down (within the drain timeout plus 10 s)."""
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.config import Config

    config = Config()
    config.bind = [f"{settings.http_host}:{settings.http_port}"]
    # Hypercorn's loggers propagate to ours: one format, no duplicated lines.
    access = logging.getLogger("hypercorn.access")
    # Hypercorn builds each access record (the whole environ included) before the logger's
    # level is checked: ~0.5 ms per request. Log access only when INFO is on.
    config.accesslog = access if access.isEnabledFor(logging.INFO) else None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.shutdown_timeout = settings.drain_timeout.total_seconds() + 10
    stop = asyncio.Event()
    _signals(stop)
    await hypercorn_serve(app, config, shutdown_trigger=stop.wait)


async def work(settings: Settings) -> None:
    """Run one worker process until SIGTERM/SIGINT; then stop gracefully."""
    from jobq import jobs
    from jobq.db import Database
    from jobq.migrate import prepare
    from jobq.queue import Worker

    dsn = await prepare(settings)
    database = await Database.open(settings, dsn)
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
    from jobq.db import connect

    dsn = await embedded.resolve_dsn(settings)
    conn = await connect(dsn)
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
    """Run `main` to completion on uvloop (libuv's event loop: about a third less CPU per job
    than asyncio's own, measured with `make bench`) where it is installed, else on asyncio's."""
    try:
        import uvloop
    except ImportError:  # not on Windows
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m jobq", description=__doc__)
    parser.add_argument("command", choices=["serve", "worker", "migrate", "check", "db-stop"])
    parser.add_argument(
        "--rescue-grace-s",
        type=float,
        default=60.0,
        help="check: how long a job of a dead or hung worker may await its rescue (seconds)",
    )
    args = parser.parse_args(argv)
    command = args.command
    settings = Settings()
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("pgserver").setLevel(logging.WARNING)  # its INFO is initdb chatter
    if command == "db-stop":
        from jobq import embedded

        stopped = embedded.stop(settings.pgdata_dir)
        print("embedded PostgreSQL stopped" if stopped else "embedded PostgreSQL was not running")
        return 0
    if command == "check":
        return run(check(settings, args.rescue_grace_s))
    runner = {"serve": serve, "worker": work, "migrate": migrate}[command]
    run(runner(settings))
    if settings.database_url is None:
        logging.getLogger("jobq").info("embedded PostgreSQL left running (make db-stop stops it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
