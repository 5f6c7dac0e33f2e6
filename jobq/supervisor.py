"""`python -m jobq run` (what `make run` does): one supervisor process, web and worker children.

The supervisor applies the migrations (starting the embedded server when `DATABASE_URL` is
unset), binds the HTTP sockets once (`bind`: one per web process on Linux, so that the kernel
spreads the connections evenly), then starts `web_processes` children `python -m jobq serve
--fd N` (hypercorn accepting on its inherited socket, no in-process worker) and
`worker_processes` children `python -m jobq worker`; 0 means one per CPU for each. A web
process restarted takes over its predecessor's socket, with the connections waiting in it.

- A child that dies is restarted after a backoff: 0.5 s, doubled for each restart of that
  child within `crash_loop_window`, at most 30 s; the log says how it ended (exit code or
  signal).
- Crash loop: a child that needs more than `crash_loop_restarts` restarts within
  `crash_loop_window` is reported with an ERROR line; the supervisor then stops every child
  and exits 1 (a crash loop needs a person, not more restarts).
- SIGTERM / SIGINT: every child gets SIGTERM (workers drain for `drain_timeout`, then release
  their jobs; web processes finish their requests within it); exit 0 once all have exited.
  A child still running `drain_timeout` + 5 s later is killed, and the exit code is 1.

Children run in sessions of their own (a Ctrl-C in the terminal reaches the supervisor only)
and, on Linux, get SIGTERM when the supervisor dies.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field

from jobq.config import Settings

log = logging.getLogger("jobq.supervisor")

FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0
KILL_AFTER_DRAIN_S = 5.0
"""How long past the drain timeout a stop waits before it kills the children still running."""


def cpu_count() -> int:
    """CPUs this process may run on (its affinity where the platform tells), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def describe_exit(code: int) -> str:
    """`exit code 3` or `killed by SIGKILL` for a `Popen.returncode`."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _child_setup() -> None:  # pragma: no cover - runs in the child between fork and exec
    os.setsid()
    if sys.platform == "linux":
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGTERM)


@dataclass
class Child:
    """One supervised child: its command, its process, and its recent restarts."""

    name: str
    argv: list[str]
    fd: int | None = None
    """The listening socket it inherits (a web process)."""
    popen: subprocess.Popen[bytes] | None = None
    restart_at: float | None = None
    """Monotonic time of the pending restart, if any."""
    restarts: deque[float] = field(default_factory=deque)
    """Monotonic times of the restarts within the crash-loop window."""


class Supervisor:
    """Starts the children, restarts the dead, stops them all on a signal. `run()` returns the
    exit code: 0 after a stop on SIGTERM/SIGINT, 1 on a crash loop or a child killed at stop."""

    def __init__(self, settings: Settings, dsn: str, listen_fds: list[int]) -> None:
        self.settings = settings
        self.env = {**os.environ, "DATABASE_URL": dsn, "JOBQ_RUN_WORKERS": "false"}
        python = [sys.executable, "-m", "jobq"]
        workers = settings.worker_processes or cpu_count()
        fds = [listen_fds[i % len(listen_fds)] for i in range(web_processes(settings))]
        self.children = [
            Child(f"web-{i}", [*python, "serve", "--fd", str(fd)], fd) for i, fd in enumerate(fds)
        ] + [Child(f"worker-{i}", [*python, "worker"]) for i in range(workers)]
        self.stopping = False

    def _on_signal(self, signum: int, _frame: object) -> None:
        if not self.stopping:
            log.info("%s: stopping the children", signal.Signals(signum).name)
        self.stopping = True

    def _start(self, child: Child) -> None:
        child.popen = subprocess.Popen(  # noqa: S603 (our own interpreter and arguments)
            child.argv,
            env=self.env,
            stdin=subprocess.DEVNULL,
            pass_fds=() if child.fd is None else (child.fd,),
            preexec_fn=_child_setup,  # safe: the supervisor runs no threads
        )
        child.restart_at = None
        log.info("started %s (pid %d)", child.name, child.popen.pid)

    def _reap(self, child: Child, now: float) -> bool:
        """Handle the exit of `child` if it has exited; return False on a crash loop."""
        if child.popen is None or (code := child.popen.poll()) is None:
            return True
        pid = child.popen.pid
        child.popen = None
        window = self.settings.crash_loop_window.total_seconds()
        while child.restarts and child.restarts[0] < now - window:
            child.restarts.popleft()
        if len(child.restarts) >= self.settings.crash_loop_restarts:
            log.error(
                "crash loop: %s (pid %d) died (%s) after %d restarts within %g s; stopping",
                child.name,
                pid,
                describe_exit(code),
                len(child.restarts),
                window,
            )
            return False
        delay = min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2 ** len(child.restarts))
        child.restarts.append(now + delay)
        child.restart_at = now + delay
        log.warning(
            "%s (pid %d) died (%s); restarting in %g s", child.name, pid, describe_exit(code), delay
        )
        return True

    def run(self) -> int:
        """Supervise until SIGTERM/SIGINT or a crash loop, then stop every child; return the
        exit code (0, or 1 on a crash loop or when a child had to be killed)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        for child in self.children:
            self._start(child)
        code = 0
        while not self.stopping:
            time.sleep(0.05)
            now = time.monotonic()
            for child in self.children:
                if self.stopping:
                    break
                if not self._reap(child, now):
                    code = 1
                    self.stopping = True
                elif child.restart_at is not None and child.restart_at <= now:
                    self._start(child)
        return max(code, self._stop_all())

    def _stop_all(self) -> int:
        """SIGTERM every child; kill those still running `drain_timeout` + 5 s later. Return 1
        when one had to be killed, else 0."""
        running = [c.popen for c in self.children if c.popen is not None]
        for popen in running:
            popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.settings.drain_timeout.total_seconds()
        deadline += KILL_AFTER_DRAIN_S
        code = 0
        for child in self.children:
            if child.popen is None:
                continue
            try:
                child.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("%s (pid %d) did not stop in time; killed", child.name, child.popen.pid)
                child.popen.kill()
                child.popen.wait()
                code = 1
            else:
                log.info("%s stopped (%s)", child.name, describe_exit(child.popen.returncode))
        return code


def web_processes(settings: Settings) -> int:
    """How many web processes `run` starts: `web_processes`, or one per CPU."""
    return settings.web_processes or cpu_count()


def bind(settings: Settings, count: int = 1) -> list[socket.socket]:
    """`count` sockets listening on `http_host:http_port` (a port of 0: a free one, the same
    for all), inheritable by the children.

    Where the kernel spreads the connections over sockets bound with `SO_REUSEPORT` (Linux),
    one per web process: processes accepting on one shared socket take the connections as they
    wake, and the first awake can take a burst of keep-alive connections whole, leaving the
    others idle. Elsewhere one socket, shared. The address is first bound alone (without
    `SO_REUSEPORT`), so that an address in use, by another `run` too, is refused as before.
    Raises: `OSError` when the address is taken or not ours."""
    family = socket.AF_INET6 if ":" in settings.http_host else socket.AF_INET
    spread = count > 1 and sys.platform == "linux" and hasattr(socket, "SO_REUSEPORT")
    port = settings.http_port
    if spread:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((settings.http_host, port))
            port = probe.getsockname()[1]
    sockets: list[socket.socket] = []
    try:
        for _ in range(count if spread else 1):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if spread:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((settings.http_host, port))
            port = sock.getsockname()[1]
            sock.listen(1024)
            sock.set_inheritable(True)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets
