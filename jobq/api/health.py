"""`/health`: 200 when the database answers, 503 when it does not."""

from __future__ import annotations

import asyncio

from pydantic import BaseModel
from quart import Blueprint
from quart_schema import validate_response

from jobq import db, statements
from jobq.errors import DatabaseUnavailable

bp = Blueprint("health", __name__)

TIMEOUT_S = 2.0


class Health(BaseModel):
    """The service's health."""

    status: str
    database: str


@bp.get("/health")
@validate_response(Health)
async def health() -> Health:
    """200 `{"status": "ok"}` when `SELECT 1` answers within 2 s; 503 otherwise."""
    try:
        async with asyncio.timeout(TIMEOUT_S):
            async with db.current_database().pool.acquire() as conn:
                await statements.database_ping.fetchval(conn)
    except Exception as exc:
        raise DatabaseUnavailable() from exc
    return Health(status="ok", database="ok")
