from collections.abc import Awaitable, Callable

from pydantic import BaseModel
from quart.typing import TestClientProtocol as Client

from jobq.db import Connection, Database
from jobq.queue import Job, JobContext, Registry, Worker, enqueue


class Args(BaseModel):
    n: int


async def test_enqueue_claim_complete(
    database: Database, conn: Connection, make_worker: Callable[..., Awaitable[Worker]]
) -> None:
    seen: list[int] = []
    handlers = Registry()

    @handlers.handler("noop", args=Args)
    async def noop(args: Args, job: JobContext) -> None:
        seen.append(args.n)

    result = await enqueue(Job(job_type="noop", arguments={"n": 1}))
    assert not result.duplicate
    worker = await make_worker(handlers)
    assert await worker.run_once() == 1
    await worker.wait_idle()
    assert seen == [1]
    assert await conn.fetchval("SELECT count(*) FROM job") == 0
    assert await conn.fetchval("SELECT count(*) FROM job_running") == 0


async def test_create_user(client: Client, conn: Connection) -> None:
    response = await client.post("/users", json={"name": "Ann", "email": "ann@example.com"})
    assert response.status_code == 201
    assert (await response.get_json())["email"] == "ann@example.com"
    assert await conn.fetchval("SELECT count(*) FROM users") == 1
