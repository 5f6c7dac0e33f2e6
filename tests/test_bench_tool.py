"""The benchmark tool (`python -m bench`): interrupted, it leaves no process behind; its report
puts a baseline's figures and ratios beside this revision's; a baseline runs in a worktree of
its own, with its own code, removed at the end; the HTTP workload's CPU meter counts each role
of the served processes and the database server apart."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
from pathlib import Path

import psutil  # type: ignore[import-untyped]
import pytest

from bench import baseline, harness, report
from bench.http_bench import CpuMeter
from jobq.config import PROJECT_ROOT
from jobq.db import Connection
from tests.toolkit.procs import eventually, subprocess_env


def _is_worker(process: psutil.Process) -> bool:
    try:
        return bool(process.cmdline()[-3:] == ["-m", "jobq", "worker"])
    except psutil.Error:
        return False


def _alive(process: psutil.Process) -> bool:
    try:
        return bool(process.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("parent", "args", "sig", "code"),
    [
        ([], [], signal.SIGTERM, 143),
        ([], [], signal.SIGINT, 130),
        # `make bench` ended by SIGTERM: make exits, the bench is told by the kernel
        (["sh", "-c", '"$@"; exit 0', "sh"], [], signal.SIGTERM, -signal.SIGTERM),
        ([], ["--baseline", "HEAD"], signal.SIGTERM, 143),
    ],
    ids=["sigterm", "sigint", "parent-sigterm", "baseline-sigterm"],
)
async def test_an_interrupted_benchmark_leaves_no_process_running(
    admin_dsn: str,
    tmp_path: Path,
    parent: list[str],
    args: list[str],
    sig: signal.Signals,
    code: int,
) -> None:
    log = tmp_path / "bench.log"
    with log.open("wb") as out:
        top = await asyncio.create_subprocess_exec(
            *parent,
            *(sys.executable, "-m", "bench", "pickup_latency", "--runs", "1", *args),
            cwd=PROJECT_ROOT,
            env=subprocess_env(admin_dsn),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    seen: dict[int, psutil.Process] = {}
    try:
        tree = psutil.Process(top.pid)

        def a_worker_runs() -> bool:
            if top.returncode is not None:
                raise AssertionError(f"the benchmark exited early:\n{log.read_text()[-3000:]}")
            seen.update((p.pid, p) for p in tree.children(recursive=True))
            return any(_is_worker(p) and _alive(p) for p in seen.values())

        # every 0.1 s: each look reads every process of the machine (psutil's children)
        await eventually(a_worker_runs, within=120, what="a worker under the benchmark", every=0.1)
        top.send_signal(sig)
        exit_code = await asyncio.wait_for(top.wait(), 120)
        with contextlib.suppress(AssertionError):  # the check below says which
            await eventually(
                lambda: not any(_alive(p) for p in seen.values()), within=120, every=0.1
            )
        survivors = [p for p in seen.values() if _alive(p)]
        assert survivors == [], [p.cmdline() for p in survivors]
        assert exit_code == code, log.read_text()[-3000:]
        assert f"bench: interrupted ({sig.name})" in log.read_text()  # not run to its end
        checkouts = [  # "bench: checking out REV (commit) in PATH"
            row.rpartition(" in ")[2]
            for row in log.read_text().splitlines()
            if row.startswith("bench: checking out")
        ]
        assert len(checkouts) == (1 if args else 0)
        for checkout in checkouts:
            assert checkout not in baseline.git("worktree", "list")
            assert not await asyncio.to_thread(Path(checkout).exists)
    finally:  # whatever failed above, nothing is left running
        if top.returncode is None:
            top.kill()
        for process in seen.values():
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        await asyncio.wait_for(top.wait(), 30)


def test_a_baseline_runs_its_own_code_in_a_worktree_removed_at_the_end() -> None:
    with baseline.worktree("HEAD", own_venv=False) as tree:
        assert tree.root.is_dir()
        assert tree.root.resolve() != PROJECT_ROOT.resolve()
        known = baseline.workloads_at(tree)
        assert known is not None
        assert "throughput" in known
        origin = tree.run("import jobq; print(jobq.__file__)").stdout.strip()
        assert Path(origin).is_relative_to(tree.root)
    assert not tree.root.exists()


async def test_a_baseline_line_is_read_from_its_json_and_a_missing_run_is_an_error(
    tmp_path: Path,
) -> None:
    """A tree whose `python -m bench` prints a line, and one whose `bench` fails."""
    (tmp_path / "ok" / "bench").mkdir(parents=True)
    (tmp_path / "ok" / "bench" / "__init__.py").write_text("")
    line = {"bench": "throughput", "concurrency": 1, "jobs_per_s": 1000.0, "runs": 1}
    (tmp_path / "ok" / "bench" / "__main__.py").write_text(
        f"print('noise')\nprint({json.dumps(json.dumps(line))})\nprint('table')\n"
    )
    (tmp_path / "bad" / "bench").mkdir(parents=True)
    (tmp_path / "bad" / "bench" / "__init__.py").write_text("")
    (tmp_path / "bad" / "bench" / "__main__.py").write_text("raise SystemExit(2)\n")
    ok = baseline.Tree("ok", tmp_path / "ok", sys.executable)
    bad = baseline.Tree("bad", tmp_path / "bad", sys.executable)
    dsn = "postgresql://nowhere/none"
    assert await baseline.run_bench(ok, "throughput", dsn, tmp_path / "ok.log") == [line]
    [failed] = await baseline.run_bench(bad, "throughput", dsn, tmp_path / "bad.log")
    assert failed["bench"] == "throughput"
    assert "bad: exit 2" in failed["error"]
    assert baseline.workloads_at(ok) is None


def test_the_report_puts_the_baseline_and_the_ratio_beside_each_figure() -> None:
    runs = [[{"concurrency": 16, "jobs_per_s": v}] for v in (900.0, 1000.0, 1100.0)]
    [current] = report.aggregate("throughput", ("concurrency",), runs, {"cores": 2})
    assert current["jobs_per_s"] == 1000.0
    assert current["per_run"] == {"jobs_per_s": [900.0, 1000.0, 1100.0]}
    old = {"bench": "throughput", "concurrency": 16, "jobs_per_s": 1250.0, "raw": 1, "runs": 3}
    compared = report.compare(current, old, "abc1234")
    assert compared["baseline"] == {"jobs_per_s": 1250.0, "raw": 1}
    assert compared["ratio"] == {"jobs_per_s": 0.8}
    missing = report.compare(current, None, "abc1234", "no workload throughput at abc1234")
    assert missing["baseline_missing"] == "no workload throughput at abc1234"

    text = report.table([compared, missing])
    header, _, *rows = text.splitlines()
    assert header.split() == [
        *("workload", "figure", "value", "runs", "baseline", "(abc1234)", "ratio", "target", "met?")
    ]
    assert rows[0].split() == [
        *(
            "throughput",
            "concurrency=16",
            "jobs_per_s",
            "1000",
            "3",
            "1250",
            "0.8",
            ">=",
            "25000",
            "NO",
        )
    ]
    assert "no workload throughput at abc1234" in text

    page = report.markdown([compared], "python -m bench --docs x", {"cores": 2, "cpu": "Z80"})
    assert "Z80, 2 cores" in page
    assert (
        "| throughput concurrency=16 | jobs_per_s | 1000 | 3 | 1250 | 0.8 | >= 25000 | NO |" in page
    )
    assert "`abc1234`" in page


BURN = """
import sys, time
end = time.process_time() + float(sys.argv[1])
while time.process_time() < end:
    pass
time.sleep(120)
"""
"""A process that spends `argv[1]` seconds of CPU, then sleeps."""


async def test_the_cpu_meter_counts_each_role_of_the_served_processes_and_the_server(
    conn: Connection,
) -> None:
    server = await harness.postmaster(conn)
    assert server is not None  # the tests' server runs on this machine
    # a served process that spends 0.3 s of CPU, with a child "worker" that spends 0.6 s
    parent = (
        f"import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', {BURN!r}, '0.6', 'worker'])\n"
        f"sys.argv = ['-c', '0.3']\n{BURN}"
    )
    served = psutil.Popen([sys.executable, "-c", parent])
    try:
        meter = CpuMeter(served.pid, server)

        reads: list[dict[str, float]] = []

        def burnt() -> bool:
            reads.append(meter.read())
            return reads[-1].get("app", 0) >= 0.3 and reads[-1].get("worker", 0) >= 0.6

        try:
            await eventually(burnt, within=60, what="both processes to spend their CPU")
        except AssertionError as exc:  # say what the meter read, and of which processes
            commands = [p.cmdline() for p in [served, *served.children()]]
            raise AssertionError(f"{exc}: it read {reads[-1]} of {commands}") from None
        spent = meter.read()
        assert 0.3 <= spent["app"] < 0.6  # the parent alone: its child is counted apart
        assert "web" not in spent
        before = meter.read()["db"]
        await conn.fetchval("SELECT count(*) FROM generate_series(1, 3000000)")
        assert meter.read()["db"] - before >= 0.05
    finally:
        for process in [*served.children(), served]:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        served.wait(timeout=10)
