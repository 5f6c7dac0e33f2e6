"""Guarantee 1 through real Quart views: a view's writes and its jobs commit or roll back as one."""

from __future__ import annotations

from quart import Quart
from quart.typing import TestClientProtocol as Client

from jobq.app import create_app
from jobq.config import Settings
from jobq.db import Connection, Database, write_transaction
from jobq.db import conn as current_conn
from jobq.errors import Conflict
from jobq.queue import Job, enqueue


def app_with_views(settings: Settings) -> Quart:
    """The app plus two views that write a user and enqueue a job, then succeed or raise."""
    app = create_app(settings)

    async def write_and_enqueue() -> int:
        user_id: int = await current_conn().fetchval(
            "INSERT INTO users (name, email, created_at) VALUES ('V', 'v@example.com', now())"
            " RETURNING id"
        )
        await enqueue(Job(job_type="welcome", arguments={"user_id": user_id}))
        return user_id

    @app.post("/ok")
    @write_transaction
    async def ok() -> dict[str, int]:
        return {"user_id": await write_and_enqueue()}

    @app.post("/boom")
    @write_transaction
    async def boom() -> dict[str, int]:
        await write_and_enqueue()
        raise Conflict("changed my mind")

    @app.post("/crash")
    @write_transaction
    async def crash() -> dict[str, int]:
        await write_and_enqueue()
        raise RuntimeError("bug")

    return app


async def counts(conn: Connection) -> tuple[int, int]:
    users: int = await conn.fetchval("SELECT count(*) FROM users")
    jobs: int = await conn.fetchval("SELECT count(*) FROM job")
    return users, jobs


async def test_view_that_raises_leaves_neither_job_nor_row(
    database: Database, settings: Settings, conn: Connection
) -> None:
    app = app_with_views(settings)
    async with app.test_app() as test_app:
        client: Client = test_app.test_client()
        response = await client.post("/boom")
        assert response.status_code == 409
        assert await counts(conn) == (0, 0)
        response = await client.post("/crash")
        assert response.status_code == 500
        assert (await response.get_json())["error"] == "internal_error"
        assert await counts(conn) == (0, 0)
        response = await client.post("/ok")
        assert response.status_code == 200
        assert await counts(conn) == (1, 1)
        job = await conn.fetchrow("SELECT job_type, arguments FROM job")
        assert job is not None
        assert job["job_type"] == "welcome"
        assert job["arguments"] == {"user_id": (await response.get_json())["user_id"]}
