"""A PostgreSQL server of one's own, in a temporary folder: the chaos suite's, which it restarts
and crashes.

It runs the `pgserver` wheel's programs (initdb, pg_ctl, postgres) the one way
`jobq.embedded.programs()` gives (as root: as the system user `pgserver`, who can reach them,
since PostgreSQL refuses to run as root), so it starts wherever the embedded server of
`make test` does. It listens on a free TCP port of 127.0.0.1 (clients reconnect over TCP as
they would to a real server) and on a Unix socket in its folder. The machine's own server and
the project's `.pgdata` are never touched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Literal

from jobq import embedded
from tests.toolkit.procs import free_port

StopMode = Literal["smart", "fast", "immediate"]

CONFIG = """
listen_addresses = '127.0.0.1'
port = {port}
unix_socket_directories = '{socket_dir}'
max_connections = 300
shared_buffers = 128MB
log_min_messages = warning
log_line_prefix = '%m [%p] %a '
track_activity_query_size = 16384
"""
"""Settings appended to postgresql.conf. fsync and synchronous_commit keep their defaults
(on): `-m immediate` is a crash, and what was committed must survive it. The whole text of the
queue's long statements shows in `pg_stat_activity` (to kill a session mid-claim)."""


class PostgresInstance:
    """One PostgreSQL server in `root` (data in `root/data`, log in `root/server.log`).

    `init()` then `start()`; `stop(mode)` and `start()` are `pg_ctl`'s (a restart is both, with
    the outage as long as the test wants); `destroy()` stops it at once and removes the folder.
    Every method blocks (run them with `asyncio.to_thread` from a test that keeps serving
    traffic meanwhile).
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data_dir = root / "data"
        self.socket_dir = root / "socket"
        self.log_path = root / "server.log"
        self.port = free_port()
        self.bin_path, self.run_as = embedded.programs()

    @classmethod
    def create(cls) -> PostgresInstance:
        """Make a temporary folder (readable by the server's user), initdb it, and return the
        instance (not started)."""
        root = Path(tempfile.mkdtemp(prefix="jobq-chaos-pg-"))
        instance = cls(root)
        instance.init()
        return instance

    @property
    def admin_dsn(self) -> str:
        """A DSN to the `postgres` database over TCP (trust authentication)."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, program: str, *args: str, timeout: float = 120) -> str:
        command = [str(self.bin_path / program), *args]
        result = subprocess.run(  # noqa: S603 (the wheel's own binaries, our arguments)
            command,
            user=self.run_as,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{' '.join(command)} exited with {result.returncode}:\n"
                f"{result.stdout}\n{result.stderr}\n--- server log ---\n{self.log_tail()}"
            )
        return result.stdout

    def init(self) -> None:
        """initdb the data folder and write the configuration."""
        self.root.chmod(0o755)
        self.data_dir.mkdir()
        self.socket_dir.mkdir()
        if self.run_as is not None:
            import pwd

            entry = pwd.getpwnam(self.run_as)
            for path in (self.root, self.data_dir, self.socket_dir):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        self._run(
            "initdb",
            "-D",
            str(self.data_dir),
            "--auth=trust",
            "--encoding=UTF8",
            "-U",
            "postgres",
            "--no-sync",
        )
        with (self.data_dir / "postgresql.conf").open("a") as conf:
            conf.write(CONFIG.format(port=self.port, socket_dir=self.socket_dir))

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        self._run(
            "pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_path), "-w", "-t", "60", "start"
        )

    def stop(self, mode: StopMode = "fast") -> None:
        """Stop the server (`fast`: disconnect clients and shut down cleanly; `immediate`: quit
        at once, as in a crash: the next start runs crash recovery)."""
        self._run("pg_ctl", "-D", str(self.data_dir), "-w", "-t", "60", "-m", mode, "stop")

    @property
    def running(self) -> bool:
        return (self.data_dir / "postmaster.pid").exists()

    def log_tail(self, chars: int = 4000) -> str:
        """The end of the server's log."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def destroy(self) -> None:
        """Stop the server at once (if it runs) and remove its folder."""
        try:
            if self.running:
                self.stop("immediate")
        finally:
            deadline = time.monotonic() + 10
            while self.running and time.monotonic() < deadline:
                time.sleep(0.1)
            shutil.rmtree(self.root, ignore_errors=True)
