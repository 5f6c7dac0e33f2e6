"""One LISTEN per host: the workers of a host elect a hub that hears `NOTIFY jobq` for them all
and wakes as many of them as there is work for.

Why: PostgreSQL signals every backend that LISTENs in a database at each notification, and
each one runs a transaction to read it, whatever its channels; and every woken worker runs a
claim. With a LISTEN per worker, one enqueue costs as many notification reads as there are
workers, and up to as many claims; with a hub, one read per host (DESIGN.md guarantee 15).

How: the workers of one host and database talk over Linux abstract Unix datagram sockets (no
file to clean up; private to the network namespace, so a container is a host of its own).
The first worker to bind the hub's address (`hub_address`) is the hub: it LISTENs on its
liveness connection; the others are followers and LISTEN on nothing. Messages, one word and
an argument, between workers of the same user only (the kernel's credentials of each
datagram are checked, `SO_PASSCRED`):

- follower to hub: `i <queues>` (idle: it has free slots in these queues, comma-separated,
  and its last claim found nothing more there; said again at the end of each of its polls),
  `m <queues>` (more: its claim filled its slots in these queues, whose jobs keep them taken,
  `jobq.queue.wakeup.SLOW_JOB_S`; or it was woken with no room to claim in them, so
  jobs may be ripe there for another worker), `h` (hello, at each heartbeat, so that the hub
  knows every follower).
- hub to follower: `w` (wake up and claim), `c <id>` (job `id` was cancelled), `a` (the
  answer to a hello).

At a notification (which does not say which queues) the hub wakes, itself first, then the most
recently idle, as few idle workers as have free slots in every queue that some idle worker has room
in: a trickle of jobs keeps a few warm workers busy, the rest sleep on. At `m <queues>` it wakes
one more idle worker with room in each of these queues: a burst of slow jobs wakes workers one
claim at a time, as many as it needs; a burst of jobs that end at once stays with the workers
that keep up with it. A cancellation goes to every follower.

The hub polls at the poll interval (`Settings.poll_interval`), and wakes at its poll the idle
followers with room in queues it has none in. A follower's poll (three times less often) claims
nothing: it says again that it is idle, and the hub's poll covers it.

Faults: a follower that finds no hub at its address (the hub stopped or died: it finds out at
its next word, a hello at the latest, each heartbeat) binds it and becomes the hub. A hub that
lives but does not answer a hello by the next one (its event loop is stuck) leaves its
followers to LISTEN for themselves, as without a hub, until it answers again. Until then, and
for a wake-up lost in a full socket buffer, the polls are the safety net, as for a lost
notification. Elsewhere than on Linux there is no hub: every worker LISTENs for itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
import os
import socket
import struct
import sys
from collections.abc import Callable

log = logging.getLogger("jobq.worker")

SUPPORTED = sys.platform == "linux"
"""Abstract socket addresses and `SO_PASSCRED` are Linux's."""

_CREDENTIALS = struct.Struct("iII")  # struct ucred: pid, uid, gid
_serial = itertools.count()
_GONE = (ConnectionRefusedError, FileNotFoundError)
"""What `sendto` raises when no socket is bound at the address."""


def hub_address(dsn: str) -> bytes:
    """The abstract socket address of the hub of the workers of this user on `dsn` (the
    database they LISTEN on): a NUL byte, then `jobq-hub-<uid>-<hash of dsn>`."""
    digest = hashlib.sha256(dsn.encode()).hexdigest()[:24]
    return f"\0jobq-hub-{os.getuid()}-{digest}".encode()


class Hub:
    """This worker's side of its host's hub (see the module's docstring).

    `wake()` wakes this worker; `cancel(job_id)` cancels a job it may run; `listen(True)` is
    called when this worker must LISTEN (it became the hub, or its hub does not answer),
    `listen(False)` when it no longer must. `open()` first, `close()` last.
    """

    def __init__(
        self,
        address: bytes,
        *,
        wake: Callable[[], None],
        cancel: Callable[[int], object],
        listen: Callable[[bool], None],
    ) -> None:
        self.address = address
        self._wake = wake
        self._cancel = cancel
        self._listen = listen
        self.leading = False
        """True while this worker is the hub."""
        self.orphaned = False
        """True while this follower's hub does not answer (hung): it LISTENs for itself."""
        self._answered = True
        """The hub answered since this follower's last hello."""
        self._sock: socket.socket | None = None
        self._idle: dict[bytes | None, frozenset[str]] = {}
        """The hub's idle workers (None: the hub itself), least recently idle first, with the
        queues they have room in."""
        self._known: set[bytes] = set()
        """The hub's followers."""

    def open(self) -> None:
        """Bind: the hub's address if it is free, else an address of this worker's own."""
        if not self._bind(self.address):
            own = f"\0jobq-worker-{os.getuid()}-{os.getpid()}-{next(_serial)}"
            self._bind(own.encode())

    def close(self) -> None:
        """Unbind (a follower then takes the hub's place)."""
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed
                asyncio.get_running_loop().remove_reader(sock.fileno())
            sock.close()
        self.leading = False

    def _bind(self, address: bytes) -> bool:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.bind(address)
        except OSError:
            sock.close()
            return False
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        sock.setblocking(False)
        self.close()
        self._sock = sock
        asyncio.get_running_loop().add_reader(sock.fileno(), self._receive)
        if address == self.address:
            self.leading, self.orphaned = True, False
            self._idle, self._known = {}, set()
            log.info("this worker is its host's wake-up hub")
            self._listen(True)
        return True

    # -- what this worker says ---------------------------------------------------------------

    def idle(self, queues: list[str]) -> None:
        """This worker has free slots in `queues` and its last claim found nothing more there."""
        if self.leading:
            self._heard("i", frozenset(queues), None)
        else:
            self._tell_hub(f"i {','.join(queues)}")

    def more(self, queues: list[str]) -> None:
        """Jobs may be ripe in `queues` that this worker has no room to claim."""
        if self.leading:
            self._heard("m", frozenset(queues), None)
        else:
            self._tell_hub(f"m {','.join(queues)}")

    def hello(self) -> None:
        """A follower reminds the hub of itself and finds out whether it lives (else it takes
        its place) and answers: a hub silent since the last hello is hung, and the follower
        LISTENs for itself until the hub answers again."""
        if self.leading:
            return
        if not self._answered and not self.orphaned:
            log.warning("the host's wake-up hub does not answer; this worker LISTENs itself")
            self.orphaned = True
            self._listen(True)
        self._answered = False
        self._tell_hub("h")

    # -- what the hub hears from PostgreSQL --------------------------------------------------

    def notified(self) -> None:
        """`NOTIFY jobq`: the hub wakes the fewest idle workers, most recently idle first, that
        have room in every queue some idle worker has room in; a follower that LISTENs for
        itself (its hub is silent) wakes itself."""
        if not self.leading:
            self._wake()
            return
        self._wake_for(frozenset().union(*self._idle.values()))

    def polled(self, room: list[str]) -> None:
        """The hub's own poll, which claims in the queues it has `room` in: wake idle
        followers for the other queues some of them have room in (a follower's own poll claims
        nothing while its hub answers, `jobq.queue.wakeup.FOLLOWER_POLLS`)."""
        self._wake_for(frozenset().union(*self._idle.values()) - set(room), but=None)

    def wake_all(self) -> None:
        """Wake this worker and every follower (notifications may have been missed)."""
        self._wake()
        for address in list(self._known):
            self._send(b"w", address)

    def cancelled(self, job_id: int) -> None:
        """Job `job_id` was cancelled: tell this worker and every follower (a follower knows
        none)."""
        self._cancel(job_id)
        for address in list(self._known):
            self._send(f"c {job_id}".encode(), address)

    # -- the sockets ---------------------------------------------------------------------------

    def _wake_for(self, queues: frozenset[str], but: bytes | None = b"") -> None:
        """Wake idle workers, the hub itself first (no datagram, no other process to wake), then
        the most recently idle, until each of `queues` has one with room in it, but `but` (the
        one asking for more, awake already; None is the hub itself)."""
        wanted = set(queues)
        order = list(self._idle.items())
        order.sort(key=lambda item: item[0] is None)  # stable: the hub last, then reversed
        for address, room in reversed(order):
            if not wanted:
                return
            if address == but or not wanted & room:
                continue
            del self._idle[address]
            if address is None:
                self._wake()
            elif not self._send(b"w", address):
                continue
            wanted -= room

    def _send(self, message: bytes, address: bytes) -> bool:
        """Send `message` to follower `address`; forget it when it is gone. Return whether it
        was sent."""
        if self._sock is None:
            return False
        try:
            self._sock.sendto(message, address)
        except _GONE:
            self._forget(address)
            return False
        except OSError:  # its buffer is full: it is busy claiming anyway
            return False
        return True

    def _forget(self, address: bytes) -> None:
        self._known.discard(address)
        self._idle.pop(address, None)

    def _tell_hub(self, message: str) -> None:
        if self._sock is None:
            return
        try:
            self._sock.sendto(message.encode(), self.address)
        except _GONE:
            self._bind(self.address)  # no hub: this worker becomes it
        except OSError:
            pass  # the hub's buffer is full: the poll is the safety net

    def _receive(self) -> None:
        while self._sock is not None:
            try:
                data, ancillary, _flags, sender = self._sock.recvmsg(
                    512, socket.CMSG_SPACE(_CREDENTIALS.size)
                )
            except (BlockingIOError, InterruptedError):
                return
            if _sender_uid(ancillary) != os.getuid():
                continue  # not one of this user's workers
            kind, _, argument = data.decode(errors="replace").partition(" ")
            if self.leading and isinstance(sender, bytes) and sender:
                self._heard(kind, frozenset(filter(None, argument.split(","))), sender)
                continue
            self._answered = True
            if self.orphaned:
                log.info("the host's wake-up hub answers again")
                self.orphaned = False
                self._listen(False)
            if kind == "w":
                self._wake()
            elif kind == "c" and argument.isdigit():
                self._cancel(int(argument))

    def _heard(self, kind: str, queues: frozenset[str], sender: bytes | None) -> None:
        """The hub hears `kind` about `queues` from `sender` (None: itself)."""
        if sender is not None:
            self._known.add(sender)
        if kind == "i":
            self._idle.pop(sender, None)  # now the most recently idle
            self._idle[sender] = queues
        elif kind == "m":
            self._wake_for(queues, but=sender)
        elif kind == "h" and sender is not None:
            self._send(b"a", sender)


def _sender_uid(ancillary: list[tuple[int, int, bytes]]) -> int | None:
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            return int(_CREDENTIALS.unpack(data[: _CREDENTIALS.size])[1])
    return None
