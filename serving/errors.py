"""The one place where the project's exceptions become HTTP responses (JSON, never a bare 500)."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from dinrec.events.errors import InvalidEvent
from dinrec.events.schema import error_message
from dinrec.feature_store.errors import StoreUnavailable
from dinrec.serving.models import NoModelYet
from dinrec.streams.errors import StreamUnavailable
from dinrec.streams.outbox import OutboxFull

log = logging.getLogger(__name__)


def error_response(status: int, error: str, message: str, request: Request, **extra) -> JSONResponse:
    """The one error shape: {"error", "message", "request_id", ...}."""
    rid = getattr(request.state, "request_id", None)
    return JSONResponse(status_code=status, content={"error": error, "message": message, "request_id": rid, **extra})


class InvalidRequest(ValueError):
    """A request that passed the schema but not a setting (e.g. k above DINREC_MAX_K) or a rule of the
    public API; ``problems`` as (field, message) when there are several."""

    def __init__(self, message: str, field: str = "", problems: list[tuple[str, str]] | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.problems = problems or [(field, message)]


# A dependency that is down (or full): 503 with the one error shape, logged with its cause.
# (error, message, Retry-After, what the log says)
_UNAVAILABLE: dict[type[Exception], tuple[str, str, str | None, str]] = {
    StoreUnavailable: ("store_unavailable", "the feature store is unavailable; retry later", None,
                       "feature store unavailable"),
    OutboxFull: ("events_backlog_full", "too many events are waiting for the stream; retry later", "5",
                 "events refused"),
    StreamUnavailable: ("stream_unavailable", "the event stream is unavailable; retry later", None,
                        "event stream unavailable"),
    # A new deployment before its first model: events are accepted meanwhile (the first retrain needs them).
    NoModelYet: ("no_model", "no model serves yet (a new deployment waits for its first); retry later", "30",
                 "no model yet"),
}


def _unavailable(error: str, message: str, retry_after: str | None, logged: str):
    async def handler(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s: %s", logged, exc)
        response = error_response(503, error, message, request)
        if retry_after is not None:
            response.headers["Retry-After"] = retry_after
        return response

    return handler


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(InvalidRequest)
    async def _invalid(request: Request, exc: InvalidRequest) -> JSONResponse:
        problems = [{"field": field, "message": message} for field, message in exc.problems]
        return error_response(422, "invalid_request", str(exc), request, problems=problems)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        names = {401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed", 409: "conflict",
                 413: "request_too_large", 429: "too_many_requests"}
        error = names.get(exc.status_code, "http_error")
        response = error_response(exc.status_code, error, str(exc.detail), request)
        for name, value in (exc.headers or {}).items():
            response.headers[name] = value
        return response

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [{"field": ".".join(str(p) for p in e.get("loc", ()) if p not in ("body", "query")),
                     "message": error_message(e)} for e in exc.errors()]
        summary = "; ".join(f"{p['field'] or 'request'}: {p['message']}" for p in problems)
        return error_response(422, "invalid_request", summary, request, problems=problems)

    @app.exception_handler(InvalidEvent)
    async def _invalid_event(request: Request, exc: InvalidEvent) -> JSONResponse:
        return error_response(422, "invalid_event", str(exc), request)

    for exc_type, answer in _UNAVAILABLE.items():
        app.add_exception_handler(exc_type, _unavailable(*answer))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return error_response(500, "internal_error", "unexpected server error", request)
