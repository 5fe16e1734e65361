"""Per-request context as plain ASGI middleware: request id, body limit, in-flight gauge, latency.

Plain ASGI rather than ``@app.middleware("http")``: Starlette's decorator form runs every request
through an extra task and memory streams, which on this path cost more CPU than the route itself.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid

import orjson

from dinrec.serving import logs
from dinrec.serving.backlog import ListenBacklog

# A client's request id becomes the id of the answer's impressions and is logged: only a plain token
# is taken (a TAB or a control character would make every impression of the answer invalid).
_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:-]{1,64}")

# Probes and scrapes are never refused for load: an overloaded worker is alive, and says how it is.
_PROBES = frozenset({"/healthz", "/readyz", "/metrics"})


class _TooLarge(Exception):
    pass


class RequestContext:
    """``x-request-id`` taken from the request when it is a plain token of at most 64 characters (else
    made) and echoed on the answer; a body larger than ``max_body_bytes`` refused with 413 before the app
    reads it (by its Content-Length, or, sent chunked, while it arrives); beyond ``max_in_flight``
    requests held at once — in the worker, and waiting in the kernel to be accepted — (0: no cap),
    requests are answered 503 with Retry-After at once, so overload sheds instead of queueing without
    bound; the in-flight gauge and the latency histogram by route template, once the service state exists.

    A body is read whole *before* its request takes an in-flight slot, within ``body_timeout_s`` of the
    headers (else 408 and the connection closed), and at most ``max_body_reads_per_client`` bodies of one
    client address arrive at once (more: 429): a client that sends headers and a Content-Length and then
    nothing holds a connection for a moment, never a slot the other requests need."""

    def __init__(self, app, max_body_bytes: int, max_in_flight: int = 0, body_timeout_s: float = 2.0,
                 max_body_reads_per_client: int = 0) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_in_flight = max_in_flight
        self.body_timeout_s = body_timeout_s
        self.max_body_reads_per_client = max_body_reads_per_client
        self._held = 0  # requests of this worker between their arrival and their answer (probes aside)
        self._reading: dict[str, int] = {}  # client address → bodies of it being read now
        self._backlog: ListenBacklog | None = None  # connections the kernel holds for us (found lazily)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, self._closing_backlog(send))
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = size = None
        chunked = False
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                rid = value.decode("latin-1") if _REQUEST_ID.fullmatch(value) else None
            elif name == b"content-length":
                size = value
            elif name == b"transfer-encoding":
                chunked = True
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

        state = getattr(scope["app"].state, "dinrec", None)  # None until the lifespan has built it
        held = False
        try:
            refused = None
            if size is not None and (not size.isdigit() or int(size) > self.max_body_bytes):
                refused = self._too_large()
            elif chunked or (size is not None and int(size) > 0):  # the body, whole, before any slot is taken
                read = await self._read_body(scope, receive, state)
                if isinstance(read, tuple):
                    refused = read
                else:
                    receive = read
            if refused is not None:
                code, error, message = refused
                if state is not None and code in (408, 429):
                    state.metrics.upload_refusals.labels("slow" if code == 408 else "per_client").inc()
                await _send_json(send_with_id, code, {"error": error, "message": message, "request_id": rid},
                                 retry_after=b"1" if code == 429 else None, close=code == 408)
                return
            if state is not None and scope["path"] not in _PROBES:  # capped: all but the probes
                if self.max_in_flight and self._held + self._waiting(scope) >= self.max_in_flight:
                    state.metrics.shed.inc()
                    await _send_json(send_with_id, 503, {
                        "error": "overloaded", "message": "too many requests in progress; retry shortly",
                        "request_id": rid}, retry_after=b"1")
                    return
                self._held += 1
                held = True
                # /recommend works inline, so requests that arrived together would otherwise each run to
                # the end before the next is even counted: one yield lets all of them take their place
                # (and stamp their arrival) first, so the newest beyond the cap are the ones refused.
                await asyncio.sleep(0)
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
            if held:
                self._held -= 1
            logs.request_id.reset(token)

    def _closing_backlog(self, send):
        """``send`` for the lifespan: when the app has shut down, our duplicate of the listening socket is
        closed too (else it keeps the port listening, with nobody to accept, after the server has gone)."""
        async def send_closing(message) -> None:
            if message["type"] in ("lifespan.shutdown.complete", "lifespan.shutdown.failed") \
                    and self._backlog is not None:
                self._backlog.close()
                self._backlog = None
            await send(message)

        return send_closing

    def _waiting(self, scope) -> int:
        """Connections queued in the kernel for this service (serving/backlog.py)."""
        if self._backlog is None:
            server = scope.get("server") or (None, 0)
            self._backlog = ListenBacklog(int(server[1] or 0))
        return self._backlog.depth()

    def _too_large(self) -> tuple[int, str, str]:
        return 413, "request_too_large", f"the body may hold at most {self.max_body_bytes} bytes"

    async def _read_body(self, scope, receive, state):
        """The request's body read now: a ``receive`` that replays it, or (status, error, message) to refuse
        the request with — too many bodies of this client arriving at once, too large, too slow."""
        client = (scope.get("client") or ("?", 0))[0]
        reading = self._reading.get(client, 0)
        if self.max_body_reads_per_client and reading >= self.max_body_reads_per_client:
            return 429, "too_many_uploads", (f"{reading} request bodies of this client are still arriving; "
                                             "send the next when one is in")
        self._reading[client] = reading + 1
        gauge = state.metrics.uploads if state is not None else None
        if gauge is not None:
            gauge.inc()
        try:
            return await asyncio.wait_for(self._buffered(receive), self.body_timeout_s)
        except _TooLarge:
            return self._too_large()
        except TimeoutError:
            return 408, "request_timeout", f"the body did not arrive within {self.body_timeout_s:g}s of the headers"
        finally:
            if gauge is not None:
                gauge.dec()
            left = self._reading[client] - 1
            if left:
                self._reading[client] = left
            else:
                del self._reading[client]

    async def _buffered(self, receive):
        """The whole body read now (at most ``max_body_bytes``, else ``_TooLarge``), and a ``receive``
        that gives it to the app as one message, then passes on to the connection (a disconnect)."""
        parts, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: the app sees that
                break
            size += len(message.get("body", b""))
            if size > self.max_body_bytes:
                raise _TooLarge
            parts.append(message.get("body", b""))
            if not message.get("more_body", False):
                message = {"type": "http.request", "body": b"".join(parts), "more_body": False}
                break
        pending = [message]

        async def replay():
            return pending.pop() if pending else await receive()

        return replay


async def _send_json(send, status: int, content: dict, retry_after: bytes | None = None,
                     close: bool = False) -> None:
    body = orjson.dumps(content)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if retry_after is not None:
        headers.append((b"retry-after", retry_after))
    if close:  # what remains of the request is unread: the connection cannot carry another one
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
