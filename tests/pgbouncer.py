"""A PgBouncer of the tests' own, in transaction pooling mode, in front of the test server.

It runs the machine's `pgbouncer` binary (Debian's package; `.ci/run` installs it) from a
temporary folder, on a free TCP port of 127.0.0.1, with trust authentication and no
`ignore_startup_parameters`: a client that sends a startup parameter PgBouncer does not know
is refused, as by a default installation. As root it runs as the system user `pgserver` (the
embedded server's), since PgBouncer refuses to run as root.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit, urlunsplit

CONFIG = """
[databases]
* = host={host} port={port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen_port}
unix_socket_dir =
auth_type = trust
auth_file = {root}/userlist.txt
pool_mode = transaction
max_client_conn = 1000
default_pool_size = 40
server_reset_query =
logfile = {root}/pgbouncer.log
pidfile = {root}/pgbouncer.pid
"""


def binary() -> str | None:
    """The `pgbouncer` program, or None when it is not installed."""
    return shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if Path(p).exists()), None
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


class PgBouncer:
    """One PgBouncer in front of the server of `server_dsn` (a TCP or Unix-socket DSN).

    `start()` returns once it accepts connections; `pooled(dsn)` is `dsn` through it;
    `stop()` ends it and removes its folder.
    """

    def __init__(self, server_dsn: str, server_port: int) -> None:
        parts = urlsplit(server_dsn)
        host = parse_qs(parts.query).get("host", [parts.hostname or "127.0.0.1"])[0]
        self.root = Path(tempfile.mkdtemp(prefix="jobq-pgbouncer-"))
        self.root.chmod(0o755)
        self.port = _free_port()
        user = parts.username or "postgres"
        (self.root / "userlist.txt").write_text(f'"{user}" ""\n')
        (self.root / "pgbouncer.ini").write_text(
            CONFIG.format(host=host, port=server_port, listen_port=self.port, root=self.root)
        )
        self.run_as: list[str] = []
        if os.geteuid() == 0:
            import pwd

            from pgserver.utils import ensure_user_exists

            ensure_user_exists("pgserver")
            entry = pwd.getpwnam("pgserver")
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
            self.run_as = ["-u", "pgserver"]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, program: str) -> None:
        """Start it and wait (up to 20 s) until it accepts connections.

        Raises: `RuntimeError` with its log when it exits or does not listen in time."""
        self.process = subprocess.Popen(  # noqa: S603 (the machine's pgbouncer, our arguments)
            [program, *self.run_as, str(self.root / "pgbouncer.ini")],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 20
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited:\n{self.log()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"pgbouncer does not listen:\n{self.log()}") from None
                time.sleep(0.05)

    def pooled(self, dsn: str) -> str:
        """`dsn`'s user and database, through this PgBouncer."""
        parts = urlsplit(dsn)
        user = parts.username or "postgres"
        return urlunsplit(("postgresql", f"{user}@127.0.0.1:{self.port}", parts.path, "", ""))

    def log(self) -> str:
        try:
            return (self.root / "pgbouncer.log").read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.root, ignore_errors=True)
