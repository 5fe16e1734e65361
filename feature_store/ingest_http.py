"""The ingest process's own HTTP endpoint: ``/metrics`` (Prometheus text) and ``/status`` (JSON)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from dinrec.feature_store.ingest_stats import IngestStats


def serve_stats(stats: IngestStats, port: int, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """Serve ``stats`` on ``host:port`` (0: a free port, see ``server.server_address``) in a thread."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    registry = stats.registry

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            if self.path == "/metrics":
                body, ctype = generate_latest(registry), CONTENT_TYPE_LATEST
            elif self.path == "/status":
                body, ctype = json.dumps(stats.snapshot()).encode(), "application/json"
            else:
                self.send_error(404, "try /metrics or /status")
                return
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:  # scrapes are not news
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="dinrec-ingest-metrics", daemon=True).start()
    return server
