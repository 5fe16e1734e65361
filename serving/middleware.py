"""Per-request context as plain ASGI middleware: request id, body limit, in-flight gauge, latency.

Plain ASGI rather than ``@app.middleware("http")``: Starlette's decorator form runs every request
through an extra task and memory streams, which on this path cost more CPU than the route itself.
"""

from __future__ import annotations

import time
import uuid

import orjson

from serving import logs


class RequestContext:
    """``x-request-id`` taken from the request (else made) and echoed on the answer; a body larger
    than ``max_body_bytes`` (by its Content-Length) refused with 413 before the app reads it; the
    in-flight gauge and the latency histogram by route template, once the service state exists."""

    def __init__(self, app, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = size = None
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                rid = value.decode("latin-1")[:64]
            elif name == b"content-length":
                size = value
        rid = rid or uuid.uuid4().hex
        t0 = time.perf_counter()
        state_dict = scope.setdefault("state", {})
        state_dict["request_id"], state_dict["started"] = rid, t0  # started: for the request's deadline
        token = logs.request_id.set(rid)
        status = 500
        rid_header = (b"x-request-id", rid.encode("latin-1"))

        async def send_with_id(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), rid_header]
            await send(message)

        try:
            if size is not None and (not size.isdigit() or int(size) > self.max_body_bytes):
                await _send_json(send_with_id, 413, {
                    "error": "request_too_large", "message": f"the body may hold at most {self.max_body_bytes} bytes",
                    "request_id": rid})
                return
            state = getattr(scope["app"].state, "dinrec", None)  # None until the lifespan has built it
            if state is None:
                await self.app(scope, receive, send_with_id)
                return
            state.metrics.in_flight.inc()
            try:
                await self.app(scope, receive, send_with_id)
            finally:
                state.metrics.in_flight.dec()
                route = getattr(scope.get("route"), "path", "unmatched")
                state.metrics.requests.labels(route, str(status)).observe(time.perf_counter() - t0)
        finally:
            logs.request_id.reset(token)


async def _send_json(send, status: int, content: dict) -> None:
    body = orjson.dumps(content)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
