"""Every process a benchmark starts, stopped however the benchmark ends.

Each subprocess the benchmark starts is `track`ed. Interrupted (SIGINT, i.e. Ctrl-C, or
SIGTERM, which it also gets when its parent exits: `stop_with_parent`), `python -m bench`
cancels its main task (`cancel_on_signals`), so that each workload's own `finally` stops what
it started, as at a normal end; then, at exit (`atexit`), `stop_all` stops whatever is still
running: it sends each tracked process its stop signal, waits, and SIGKILLs the process and
every descendant it had (a `python -m jobq run` supervisor's web and worker processes, or
another benchmark's workers) that is still alive.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import signal
import subprocess
import sys

import psutil  # type: ignore[import-untyped]

STOP_WAIT_S = 60.0
"""How long `stop_all` waits after the stop signals before it SIGKILLs: a benchmark's own
clean-up (its workers' drains, its database dropped, the fleet's server stopped) on a busy
machine."""

_tracked: list[tuple[subprocess.Popen[bytes], signal.Signals]] = []


def track(popen: subprocess.Popen[bytes], stop_signal: signal.Signals = signal.SIGTERM) -> None:
    """Have `stop_all` stop `popen` (with `stop_signal`, then SIGKILL) if it still runs then."""
    if not _tracked:
        atexit.register(stop_all)
    _tracked.append((popen, stop_signal))


def _tree(pid: int) -> list[psutil.Process]:
    """The process `pid` and its descendants, those alive now."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _alive(process: psutil.Process) -> bool:
    try:
        return bool(process.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def stop_all(wait_s: float = STOP_WAIT_S) -> None:
    """Send every tracked process still running its stop signal, wait up to `wait_s` for it and
    its descendants to exit, then SIGKILL those left; reap the tracked ones."""
    running = [(p, sig) for p, sig in _tracked if p.poll() is None]
    procs: dict[int, psutil.Process] = {}
    for popen, sig in running:
        procs.update((p.pid, p) for p in _tree(popen.pid))
        with contextlib.suppress(ProcessLookupError):
            popen.send_signal(sig)
    _, alive = psutil.wait_procs([p for p in procs.values() if _alive(p)], timeout=wait_s)
    for popen, _ in running:  # children started meanwhile (a supervisor restarting one)
        procs.update((p.pid, p) for p in _tree(popen.pid))
    for process in [*alive, *procs.values()]:
        if _alive(process):
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
    for popen, _ in running:
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(timeout=wait_s)
    _tracked[:] = [(p, sig) for p, sig in _tracked if p.poll() is None]


def stop_with_parent() -> None:
    """On Linux, have the kernel send this process SIGTERM when its parent exits: `make` ended
    by SIGTERM exits without passing the signal on to the recipe's process."""
    if sys.platform == "linux":
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGTERM)


def cancel_on_signals(task: asyncio.Task[object]) -> None:
    """Cancel `task` on SIGTERM, as asyncio's runner does on SIGINT: the workloads' `finally`
    blocks stop their processes and drop their databases; a second signal cancels again, which
    cuts that short (then `stop_all`, at exit, kills what is left)."""
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
