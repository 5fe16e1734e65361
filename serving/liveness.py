"""Liveness answered off the request loop: a small HTTP server on its own thread and port.

On the service's port ``/healthz`` waits its turn behind every request the worker's event loop
holds, so under overload a liveness probe times out and the orchestrator restarts a worker that was
merely busy — turning overload into an outage. Here the probe is answered by a thread of its own,
and what it reports is whether the event loop still turns: a heartbeat the loop stamps every
``beat_s``; a loop that has not stamped for ``max_stall_s`` (blocked, deadlocked) is not alive.

Every worker of a replica binds the same port (SO_REUSEPORT); the kernel hands each probe to one of
them, so a probe asks one worker at a time — the supervisor (uvicorn's) restarts workers that exit.
"""

from __future__ import annotations

import asyncio
import http.server
import logging
import socketserver
import threading
import time
from contextlib import ExitStack

import orjson

log = logging.getLogger(__name__)


class LoopHeartbeat:
    """The monotonic time the event loop last ran its stamp (every ``beat_s`` seconds)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, beat_s: float = 0.5) -> None:
        self.loop, self.beat_s = loop, beat_s
        self.last = time.monotonic()
        self._handle: asyncio.TimerHandle | None = None

    def start(self) -> LoopHeartbeat:
        self.loop.call_soon_threadsafe(self._beat)
        return self

    def _beat(self) -> None:
        self.last = time.monotonic()
        self._handle = self.loop.call_later(self.beat_s, self._beat)

    def stall_s(self) -> float:
        return max(0.0, time.monotonic() - self.last)

    def stop(self) -> None:
        if self._handle is not None:
            self.loop.call_soon_threadsafe(self._handle.cancel)


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    allow_reuse_address = True
    allow_reuse_port = True  # the replica's workers share the port
    daemon_threads = True


def _handler(heartbeat: LoopHeartbeat, max_stall_s: float) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        timeout = 5  # a probe that does not send its request line in 5 s is dropped

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.split("?", 1)[0] != "/healthz":
                self._answer(404, {"detail": "only /healthz is served on the liveness port"})
                return
            stall = heartbeat.stall_s()
            alive = stall < max_stall_s
            self._answer(200 if alive else 503,
                         {"status": "ok" if alive else "stalled", "loop_stall_s": round(stall, 3)})

        def _answer(self, status: int, body: dict) -> None:
            data = orjson.dumps(body)
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:  # probes every few seconds are not log lines
            pass

    return Handler


def start_liveness(parts: ExitStack, host: str, port: int, max_stall_s: float) -> LoopHeartbeat:
    """Serve ``GET /healthz`` on ``host:port`` from a thread, reporting whether the running event loop
    stamped its heartbeat within ``max_stall_s``; stopped when ``parts`` closes."""
    heartbeat = LoopHeartbeat(asyncio.get_running_loop()).start()
    parts.callback(heartbeat.stop)
    server = _Server((host, port), _handler(heartbeat, max_stall_s))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.5},
                              name="dinrec-liveness", daemon=True)
    thread.start()
    log.info("liveness on %s:%d (off the request loop)", host, server.server_address[1])

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    parts.callback(stop)
    return heartbeat
