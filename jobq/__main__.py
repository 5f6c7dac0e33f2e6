"""`python -m jobq serve | worker | migrate | db-stop`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from jobq.config import Settings


def _signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


async def serve(settings: Settings) -> None:
    """Serve the API with hypercorn (and, unless JOBQ_RUN_WORKERS=false, a worker) until
    SIGTERM/SIGINT; then stop gracefully."""
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.config import Config

    from jobq.app import create_app

    config = Config()
    config.bind = [f"{settings.http_host}:{settings.http_port}"]
    # Hypercorn's loggers propagate to ours: one format, no duplicated lines.
    config.accesslog = logging.getLogger("hypercorn.access")
    config.errorlog = logging.getLogger("hypercorn.error")
    config.shutdown_timeout = settings.drain_timeout.total_seconds() + 10
    stop = asyncio.Event()
    _signals(stop)
    await hypercorn_serve(create_app(settings), config, shutdown_trigger=stop.wait)


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


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m jobq", description=__doc__)
    parser.add_argument("command", choices=["serve", "worker", "migrate", "db-stop"])
    command = parser.parse_args(argv).command
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
    runner = {"serve": serve, "worker": work, "migrate": migrate}[command]
    asyncio.run(runner(settings))
    if settings.database_url is None:
        logging.getLogger("jobq").info("embedded PostgreSQL left running (make db-stop stops it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
