"""The operating system: bytes a connected socket's kernel send queue holds, not yet sent.

What a server has "taken but not written to the network" does not end at its own buffer: the
kernel's send queue of the connection holds whatever the server wrote and the peer's receive
window did not let out yet. On Linux that queue grows, by autotuning, to ``tcp_wmem``'s
maximum (4 MiB by default), so a client that stops reading can absorb megabytes of small
frames there while daphne's buffer (or uvicorn's, whose ``send`` then never waits) stays
empty: measured in the server alone, such a socket is never seen to stall. ``unsent`` reads
that queue.

Linux answers it with ioctls of ``linux/sockios.h``, part of its user-space API: for TCP,
``SIOCOUTQNSD``, the bytes queued and not yet sent (those sent and waiting for their
acknowledgement are on the network: counting them would take a fast link with a long round
trip for a stall); for a Unix socket, ``SIOCOUTQ``, the bytes its peer has not read yet.
Elsewhere there is no such call, and ``check`` (the self-test, once per process: a real
loopback connection whose peer does not read) says in one ERROR line that the kernel's share
is not counted.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import platform
import socket
import sys
import termios
from typing import Protocol

logger = logging.getLogger(__name__)

#: ``linux/sockios.h``: a TCP socket's bytes queued but not yet sent.
SIOCOUTQNSD = 0x894B
#: ``linux/sockios.h`` (``SIOCOUTQ``, ``TIOCOUTQ``): a Unix socket's bytes its peer has not read.
SIOCOUTQ = termios.TIOCOUTQ
#: Bytes the self-test writes and must read back from the queue.
PROBE_BYTES = 64 * 1024


class Handle(Protocol):
    """What ``unsent`` needs of a socket: ``socket.socket``, asyncio's ``TransportSocket``,
    uvloop's pseudo-socket."""

    @property
    def family(self) -> int: ...

    def fileno(self) -> int: ...


def unsent(handle: Handle | None) -> int:
    """Bytes the kernel holds for the connection of ``handle`` and has not sent; 0 where that
    cannot be read (no handle, a closed socket, a system without the call, the self-test
    failed). Never raises: a socket observed while it closes has nothing more to send."""
    if handle is None or not _verdict:
        return 0
    try:
        request = SIOCOUTQ if handle.family == socket.AF_UNIX else SIOCOUTQNSD
        # A closed socket's fileno() is -1 (never a number reused by another file).
        return max(0, _read(handle.fileno(), request))
    except (OSError, ValueError):
        return 0


# The self-test ---------------------------------------------------------------------------

_verdict: bool | None = None


def check() -> bool:
    """Whether ``unsent`` reads the kernel's queue here, checked once per process; if not, one
    ERROR line says so."""
    global _verdict
    if _verdict is None:
        problem = missing()
        _verdict = problem is None
        if problem is not None:
            logger.error(
                "realtime: the kernel's send queue of a socket cannot be read on %s (%s): a "
                "client that stops reading is noticed only once the server's own buffer holds "
                "its backlog, after the kernel has taken up to its send buffer's size (a few "
                "MiB); a socket sent only small frames may go unnoticed until the server's "
                "ping timeout.",
                platform.system() or sys.platform,
                problem,
            )
    return _verdict


def missing() -> str | None:
    """Why ``unsent`` cannot read the queue here (``None``: it can). Writes to a loopback TCP
    connection whose peer, with a small window, reads nothing; part of it must read back as
    queued and unsent."""
    if not sys.platform.startswith("linux"):
        return "only Linux's SIOCOUTQNSD is known"
    try:
        with socket.socket() as server:
            # Before listen: the accepted peer's window is small from the start.
            server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            server.bind(("127.0.0.1", 0))
            server.listen()
            with socket.create_connection(server.getsockname(), timeout=5) as client:
                peer, _ = server.accept()
                with peer:
                    client.setblocking(False)
                    written = 0
                    with contextlib.suppress(BlockingIOError):
                        while written < PROBE_BYTES:
                            written += client.send(b"\0" * (PROBE_BYTES - written))
                    queued = _read(client.fileno(), SIOCOUTQNSD)
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    if not 0 < queued <= written:
        return f"SIOCOUTQNSD reads {queued} bytes where {written} were written and not read"
    return None


def _read(fd: int, request: int) -> int:
    """The ioctl's answer, an ``int``; raises ``OSError``."""
    answer = fcntl.ioctl(fd, request, b"\0\0\0\0")
    return int.from_bytes(answer, sys.byteorder, signed=True)
