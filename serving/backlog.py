"""How many connections wait in the kernel for this service to accept them.

`/recommend` is CPU work inline on a worker's event loop, and a request on a new connection reaches
the worker only when the loop accepts it — one per turn of the loop while it is busy. So under
overload the queue is not in the worker but in the kernel's accept queue of the listening socket,
out of the middleware's sight. Linux reports that queue's length in TCP_INFO of the listening socket
(``tcpi_unacked`` while it listens); the in-flight cap (serving/middleware.py) counts it, so a worker
sheds — answers the connections it takes 503 in a fraction of a millisecond — until the queue is short
again, instead of working through seconds of requests whose clients have given up.
"""

from __future__ import annotations

import logging
import os
import socket
import struct

log = logging.getLogger(__name__)
_TCPI_UNACKED = 24  # byte offset in struct tcp_info: 8 one-byte fields, then rto, ato, snd_mss, rcv_mss


class ListenBacklog:
    """The accept-queue length of the socket listening on ``port`` in this process (0 where unknown)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._sock = _listening_socket(port)
        if self._sock is None:
            log.info("listening socket for port %d not found: the in-flight cap counts requests in the worker only",
                     port)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def depth(self) -> int:
        if self._sock is None:
            return 0
        try:
            info = self._sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
        except OSError:
            return 0
        return struct.unpack_from("I", info, _TCPI_UNACKED)[0]


def _listening_socket(port: int) -> socket.socket | None:
    """A duplicate of the listening socket on ``port`` among this process' descriptors (uvicorn's, or the
    one the parent bound for its workers); found once, when the first request arrives."""
    if not hasattr(socket, "TCP_INFO") or not os.path.isdir("/proc/self/fd"):
        return None
    for name in os.listdir("/proc/self/fd"):
        try:
            fd = os.dup(int(name))
        except OSError:
            continue
        try:
            sock = socket.socket(fileno=fd)
        except OSError:  # not a socket
            os.close(fd)
            continue
        try:
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) and sock.getsockname()[1] == port:
                return sock
        except (OSError, IndexError, TypeError):  # a unix socket, a socket in another state
            pass
        sock.close()
    return None
