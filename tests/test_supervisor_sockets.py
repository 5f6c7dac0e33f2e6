"""`jobq.supervisor.bind`: one listening socket per web process, the connections spread over
them by the kernel (Linux), so that a burst of keep-alive connections does not all go to the
web process that happens to wake first."""

from __future__ import annotations

import select
import socket
import sys

import pytest

from jobq.config import Settings
from jobq.supervisor import bind

CONNECTIONS = 64


@pytest.mark.skipif(sys.platform != "linux", reason="SO_REUSEPORT spreads connections on Linux")
def test_connections_are_spread_over_the_sockets_of_the_web_processes() -> None:
    sockets = bind(Settings(_env_file=None, http_host="127.0.0.1", http_port=0), 2)
    clients = []
    try:
        assert len(sockets) == 2
        port = sockets[0].getsockname()[1]
        assert port != 0
        assert sockets[1].getsockname()[1] == port
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(CONNECTIONS)]
        accepted = [0, 0]
        while sum(accepted) < CONNECTIONS:
            ready, _, _ = select.select(sockets, [], [], 10)
            assert ready, f"only {sum(accepted)} of {CONNECTIONS} connections arrived"
            for sock in ready:
                conn, _ = sock.accept()
                conn.close()
                accepted[sockets.index(sock)] += 1
        assert min(accepted) > 0, accepted  # all on one: 2 chances in 2**64
    finally:
        for sock in [*clients, *sockets]:
            sock.close()


def test_one_socket_for_one_process() -> None:
    sockets = bind(Settings(_env_file=None, http_host="127.0.0.1", http_port=0))
    try:
        assert len(sockets) == 1
        assert sockets[0].get_inheritable()
    finally:
        sockets[0].close()


@pytest.mark.skipif(sys.platform != "linux", reason="SO_REUSEPORT spreads connections on Linux")
def test_an_address_in_use_is_refused_even_by_a_second_run() -> None:
    first = bind(Settings(_env_file=None, http_host="127.0.0.1", http_port=0), 2)
    try:
        port = first[0].getsockname()[1]
        with pytest.raises(OSError, match="in use"):
            bind(Settings(_env_file=None, http_host="127.0.0.1", http_port=port), 2)
    finally:
        for sock in first:
            sock.close()
