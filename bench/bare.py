"""The bare endpoint: the reference that `http_reminders` compares the real API with.

`POST /bare` with a JSON body `{"message": ...}` runs one INSERT in one transaction (jobq's
`write_transaction`, on a pool opened like the app's) and answers 201 `{"id": ...}`; `GET
/health` answers 200 without touching the database. `python -m bench.bare` serves it the way
`python -m jobq serve` serves the app: hypercorn on uvloop in this one process, on
`JOBQ_HTTP_HOST` and `JOBQ_HTTP_PORT`, with the same settings (`DATABASE_URL`, pool sizes, log
level: the access log at INFO). The table (`bench_bare`) is the benchmark's
(`bench.handlers.TABLES_SQL`).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from quart import Quart, request

from jobq import clock, db
from jobq.__main__ import run, serve_app
from jobq.config import Settings
from jobq.db import Database, write_transaction


def create_bare_app(settings: Settings) -> Quart:
    """The bare app on the database of `settings` (which must name one: `DATABASE_URL`)."""
    if settings.database_url is None:
        raise ValueError("the bare endpoint needs DATABASE_URL")
    dsn = settings.database_url.get_secret_value()
    app = Quart("bench-bare")

    @app.before_serving
    async def start() -> None:
        app.extensions["bench.db"] = await Database.open(settings, dsn)

    @app.after_serving
    async def stop() -> None:
        await app.extensions["bench.db"].close()

    @app.before_request
    async def bind_database() -> None:
        db.bind(app.extensions["bench.db"])

    @app.get("/health")
    async def health() -> tuple[dict[str, str], int]:
        return {"status": "ok"}, 200

    @app.post("/bare")
    @write_transaction
    async def bare() -> tuple[dict[str, Any], int]:
        data = await request.get_json()
        new_id = await db.conn().fetchval(
            "INSERT INTO bench_bare (message, created_at) VALUES ($1, $2) RETURNING id",
            str(data["message"]),
            clock.now(),
        )
        return {"id": new_id}, 201

    return app


async def serve(settings: Settings) -> None:
    """Serve the bare app exactly as `python -m jobq serve` serves jobq, until SIGTERM/SIGINT."""
    await serve_app(create_bare_app(settings), settings)


def main() -> int:
    settings = Settings()
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    run(serve(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
