"""The service in a background thread on loopback (the demo, the API tests): uvicorn, returned
only once it accepts requests, stopped when the block ends."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_in_thread(app, port: int, *, start_timeout_s: float = 60.0,
                    name: str = "dinrec-server") -> Iterator[threading.Thread]:
    import uvicorn

    from dinrec.serving.http_timeouts import PROTOCOL

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", http=PROTOCOL))
    thread = threading.Thread(target=server.run, name=name, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the server did not start on port {port}")
        time.sleep(0.02)
    try:
        yield thread
    finally:
        server.should_exit = True
        thread.join(timeout=15)
