"""`python -m jobq top` in a pseudo-terminal, as a person runs it: its frame shows the queues
(depth, running, jobs/s), the workers and the dead letter, refreshes, and Ctrl-C ends it with
exit 0."""

from __future__ import annotations

import asyncio
import os
import pty
import re
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from jobq import clock
from jobq.config import PROJECT_ROOT
from jobq.dashboard import format
from jobq.db import Connection, Database
from jobq.queue import Job, Registry, enqueue
from tests.queue.helpers import MakeWorker
from tests.toolkit.procs import START_S, eventually, subprocess_env

DASH = format.DASH
"""What a figure not measured yet shows."""

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|\r")


class Terminal:
    """A process on a pseudo-terminal of 120x40; `screen()` is all it wrote, without the
    terminal's control sequences."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.master, slave = pty.openpty()
        os.set_blocking(self.master, False)
        self.process = subprocess.Popen(  # noqa: S603 (our own interpreter and arguments)
            args,
            cwd=PROJECT_ROOT,
            env={**env, "TERM": "xterm-256color", "COLUMNS": "120", "LINES": "40"},
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
        )
        os.close(slave)
        self.written = b""

    def screen(self) -> str:
        try:
            while chunk := os.read(self.master, 65536):
                self.written += chunk
        except (BlockingIOError, OSError):  # nothing more now; OSError: the process is gone
            pass
        return ANSI.sub("", self.written.decode(errors="replace"))

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        os.close(self.master)


@pytest.fixture
def terminal(database_url: str) -> Iterator[list[Terminal]]:
    opened: list[Terminal] = []
    yield opened
    for t in opened:
        t.close()


async def test_top_shows_queues_workers_and_rates_until_ctrl_c(
    terminal: list[Terminal],
    database: Database,
    database_url: str,
    conn: Connection,
    make_worker: MakeWorker,
) -> None:
    handlers = Registry()
    handlers.queue("top")  # written to job_queue by the worker's start
    worker = await make_worker(handlers)
    for n in range(3):
        await enqueue(Job(job_type="top.test", arguments={"n": n}, queue="top"))
    await conn.execute(
        "INSERT INTO job_dead (id, job_type, arguments, priority, attempts, max_retries,"
        " last_error, created_at, died_at) VALUES (99, 't', '{}', 0, 1, 0, 'boom', $1, $1)",
        clock.now(),
    )
    top = Terminal(
        [sys.executable, "-m", "jobq", "top", "--interval", "0.5"], subprocess_env(database_url)
    )
    terminal.append(top)

    def frame_shown() -> str | None:
        # a whole frame: its workers table drawn to the bottom border (a loaded machine shows a
        # frame in pieces)
        screen = top.screen()
        workers = screen.find("workers")
        done = workers >= 0 and "┘" in screen[workers:]
        return screen if done and "│ top" in screen else None

    screen = await eventually(frame_shown, within=START_S, what="a frame of top", every=0.1)
    assert "jobq top" in screen
    assert "dead letter 1" in screen
    row = next(line for line in screen.splitlines() if line.startswith("│ top"))
    cells = [cell.strip() for cell in row.split("│")[1:7]]
    assert cells == ["top", "active", "3", DASH, "0", "0"], row  # queue, state, ripe, held, ...
    assert re.search(rf"│ +{worker.id} │.*│ alive │", screen), screen

    # it refreshes: counts added now show as rates in a later frame
    await conn.execute(
        "INSERT INTO job_counter (queue, job_type, event, count) VALUES ('top', 't', 'enqueued',"
        " 1000000)"
    )

    def rate_shown() -> bool:
        rows = [line for line in top.screen().splitlines() if line.startswith("│ top")]
        return any(line.split("│")[7].strip() not in (DASH, "0") for line in rows)

    await eventually(rate_shown, within=START_S, what="the enqueue rate", every=0.1)
    top.process.send_signal(signal.SIGINT)  # Ctrl-C
    code = await asyncio.to_thread(top.process.wait, START_S)
    assert code == 0, top.screen()[-2000:]
    assert "Traceback" not in top.screen()
