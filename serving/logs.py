"""Logging for the service: JSON lines carrying the request id of the request being served."""

from __future__ import annotations

import contextvars
import json
import logging
import time

request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("dinrec_request_id", default=None)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        entry = {"time": stamp, "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        rid = request_id.get()
        if rid is not None:
            entry["request_id"] = rid
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure(fmt: str = "json", level: int = logging.INFO) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else
                         logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
