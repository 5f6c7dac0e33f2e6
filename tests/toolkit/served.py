"""The app served in this process by hypercorn, for what only a real HTTP client sends or sees."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator

from hypercorn.asyncio import serve
from hypercorn.config import Config
from quart import Quart


@contextlib.asynccontextmanager
async def served(
    app: Quart, config: Config | None = None, *, access_log: bool = False
) -> AsyncIterator[str]:
    """Serve `app` with hypercorn (`config`, default hypercorn's own) on an ephemeral port of
    127.0.0.1 and yield its base URL (`http://127.0.0.1:<port>`); stop it at the end. The
    socket listens before hypercorn starts, so connections made meanwhile wait in its backlog.
    Access lines go to the `hypercorn.access` logger with `access_log`, else nowhere;
    hypercorn's errors go to the `hypercorn.error` logger."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    config = config or Config()
    config.bind = [f"fd://{sock.detach()}"]
    config.accesslog = logging.getLogger("hypercorn.access") if access_log else None
    config.errorlog = logging.getLogger("hypercorn.error")
    stop = asyncio.Event()
    server = asyncio.create_task(serve(app, config, shutdown_trigger=stop.wait))
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop.set()
        await server
