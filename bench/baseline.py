"""`python -m bench --baseline REV [workload ...]`: the same workloads at another git revision,
in the same sitting, side by side.

REV is checked out in a temporary git worktree (`git worktree add --detach`), removed at the
end. Its code runs with this interpreter (this `.venv`) and `PYTHONPATH` at its root, so that
its own `jobq` and `bench` are imported (checked before the first run); with `--baseline-venv`,
in a venv of its own made for it (`pip install -e <worktree>[dev]`), for a revision whose
dependencies differ. Each workload runs as its tree's own `python -m bench WORKLOAD --runs 1`
(whatever its benchmark code is at REV), once per round, alternating: this revision, the
baseline, this revision, the baseline, ...; both on the same server (`DATABASE_URL`, else the
embedded one), each in a fresh database of its own. The JSON lines each prints are read back;
each figure's median over the rounds is reported beside the baseline's and their ratio (this
revision over the baseline). A workload that REV does not have is said so, and runs here alone.
Each run's log (stderr) is in `.bench/logs/<stamp>/`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from bench import children, report
from bench.context import Figures
from bench.report import Line
from bench.workloads import WORKLOADS
from jobq.config import PROJECT_ROOT

Popen = subprocess.Popen[bytes]


@dataclass(frozen=True)
class Tree:
    """A source tree whose benchmarks run: its name in the report, root, and interpreter."""

    label: str
    root: Path
    python: str

    def env(self, dsn: str) -> dict[str, str]:
        """The environment of its `python -m bench`: its root first on the path, the server."""
        return {**os.environ, "PYTHONPATH": str(self.root), "DATABASE_URL": dsn}

    def run(self, code: str) -> subprocess.CompletedProcess[str]:
        """Run `python -c code` in this tree (no database)."""
        return subprocess.run(  # noqa: S603 (our interpreter, our code)
            [self.python, "-c", code],
            cwd=self.root,
            env={**os.environ, "PYTHONPATH": str(self.root)},
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )


def git(*args: str) -> str:
    """Run `git args` in the project's checkout; return its output (stripped)."""
    done = subprocess.run(  # noqa: S603 (git, our arguments)
        ["git", "-C", str(PROJECT_ROOT), *args],  # noqa: S607 (git from PATH)
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


@contextlib.contextmanager
def worktree(rev: str, *, own_venv: bool) -> Iterator[Tree]:
    """A detached worktree of `rev` in a temporary folder, and its interpreter; both removed at
    the end."""
    commit = git("rev-parse", "--verify", "--short", f"{rev}^{{commit}}")
    folder = Path(tempfile.mkdtemp(prefix="jobq-bench-baseline-"))
    root = folder / "tree"
    try:
        print(f"bench: checking out {rev} ({commit}) in {root}", file=sys.stderr)
        git("worktree", "add", "--detach", str(root), commit)
        python = sys.executable
        if own_venv:
            python = _venv(folder / "venv", root)
        tree = Tree(rev, root, python)
        _check_imports(tree)
        yield tree
    finally:
        with contextlib.suppress(RuntimeError):
            git("worktree", "remove", "--force", str(root))
        shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(RuntimeError):
            git("worktree", "prune")


def _venv(path: Path, root: Path) -> str:
    """Make a venv at `path` with the project at `root` installed (editable, dev extra)."""
    print(f"bench: making a venv for the baseline in {path}", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)  # noqa: S603
    python = str(path / "bin" / "python")
    pip = [python, "-m", "pip", "install", "--quiet", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "-e", f"{root}[dev]"], check=True)  # noqa: S603
    return python


def _check_imports(tree: Tree) -> None:
    """Fail unless `tree` imports its own `jobq` (and its own `bench`, where it has one)."""
    code = (
        "import importlib.util as u, json\n"
        "print(json.dumps([getattr(u.find_spec(m), 'origin', None) for m in ('jobq', 'bench')]))"
    )
    done = tree.run(code)
    if done.returncode != 0:
        raise RuntimeError(f"{tree.label}: the interpreter fails:\n{done.stderr}")
    for name, origin in zip(("jobq", "bench"), json.loads(done.stdout), strict=True):
        if origin is not None and not Path(origin).resolve().is_relative_to(tree.root.resolve()):
            raise RuntimeError(f"{tree.label}: `{name}` is imported from {origin}, not the tree")


def workloads_at(tree: Tree) -> list[str] | None:
    """The workloads `tree`'s `python -m bench` knows, or None when it cannot tell (no `bench`
    package, or one whose workloads are not listed in `bench.__main__.WORKLOADS` or
    `bench.workloads.WORKLOADS`)."""
    for module in ("bench.workloads", "bench.__main__"):
        done = tree.run(
            f"import json; from {module} import WORKLOADS; print(json.dumps(list(WORKLOADS)))"
        )
        if done.returncode == 0:
            names: list[str] = json.loads(done.stdout.splitlines()[-1])
            return names
    return None


def _start(tree: Tree, args: list[str], dsn: str, out: IO[bytes], err: IO[bytes]) -> Popen:
    """Start `python -m bench args` in `tree`, in a session of its own, tracked."""
    popen = subprocess.Popen(  # noqa: S603 (our interpreters, our arguments)
        [tree.python, "-m", "bench", *args],
        cwd=tree.root,
        env=tree.env(dsn),
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=err,
        start_new_session=True,
    )
    children.track(popen, signal.SIGINT)
    return popen


async def run_bench(tree: Tree, workload: str, dsn: str, log: Path) -> list[Line]:
    """Run `python -m bench WORKLOAD --runs 1` in `tree` on the server `dsn`; return the JSON
    lines it printed (an `"error"` line when it printed none). Its stderr goes to `log`.
    It runs in a session of its own and is stopped by SIGINT (what its own clean-up answers,
    whatever its revision) when this one is interrupted."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as err, tempfile.TemporaryFile() as out:
        popen = _start(tree, [workload, "--runs", "1"], dsn, out, err)
        try:
            code = await asyncio.to_thread(popen.wait)
        finally:
            if popen.poll() is None:
                children.stop_all()
        out.seek(0)
        text = out.read().decode(errors="replace")
    lines = [json.loads(row) for row in text.splitlines() if row.startswith("{")]
    lines = [line for line in lines if line.get("bench") == workload]
    if not lines:
        lines = [{"bench": workload, "error": f"{tree.label}: exit {code}, no figures; see {log}"}]
    return lines


def figures_of(line: Line) -> Figures:
    """A printed line's own figures and keys (without its medians' bookkeeping)."""
    return {k: v for k, v in line.items() if k not in report.META}


async def compare(
    names: list[str], rounds: dict[str, int], baseline: Tree, dsn: str, log_dir: Path
) -> list[Line]:
    """Run each workload of `names` `rounds[name]` times here and at `baseline`, interleaved;
    return this revision's lines with the baseline's figures and ratios (`report.compare`)."""
    here = Tree("current", PROJECT_ROOT, sys.executable)
    known = await asyncio.to_thread(workloads_at, baseline)
    out: list[Line] = []
    for name in names:
        keys = WORKLOADS[name].keys
        absent = known is not None and name not in known
        sides: dict[str, list[list[Figures]]] = {"current": [], "baseline": []}
        errors: dict[str, str] = {}
        machine: dict[str, Any] = {}
        for n in range(1, rounds[name] + 1):
            for side, tree in (("current", here), ("baseline", baseline)):
                if side == "baseline" and absent:
                    continue
                log = log_dir / f"{name}-{side}-round{n}.log"
                started = time.monotonic()
                lines = await run_bench(tree, name, dsn, log)
                took = time.monotonic() - started
                print(
                    f"bench: {name} round {n}/{rounds[name]} at {tree.label} ({took:.1f} s):"
                    f" {[figures_of(line) for line in lines]}",
                    file=sys.stderr,
                )
                for line in lines:
                    if "error" in line:
                        errors[side] = str(line["error"])
                    if side == "current" and "machine" in line:
                        machine = line["machine"]
                ok = [figures_of(line) for line in lines if "error" not in line]
                if ok:
                    sides[side].append(ok)
        current = report.aggregate(name, keys, sides["current"], machine)
        if not current:
            current = [{"bench": name, "error": errors.get("current", "no figures")}]
        elif "current" in errors:  # some rounds failed: said on the first line
            current[0]["error"] = errors["current"]
        base = {
            tuple(line.get(k) for k in keys): line
            for line in report.aggregate(name, keys, sides["baseline"], {})
        }
        if absent:
            missing = f"no workload {name} at {baseline.label}"
        elif "baseline" in errors:
            missing = f"failed at {baseline.label}: {errors['baseline']}"
        else:
            missing = f"no such line at {baseline.label}"
        for line in current:
            match = base.get(tuple(line.get(k) for k in keys))
            out.append(report.compare(line, match, baseline.label, missing))
    return out
