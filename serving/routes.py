"""HTTP routes. Handlers are sync (`def`): FastAPI runs them in its thread pool, so torch and the
Redis client never block the event loop."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse

from feature_store.errors import StoreUnavailable
from feature_store.streams.base import event_record
from serving.deps import State
from serving.schemas import (
    EventsRequest,
    EventsResponse,
    RecommendedItem,
    RecommendRequest,
    RecommendResponse,
    UserId,
)

router = APIRouter()


def _recommend(state: State, request: Request, user_id: str, k: int | None) -> RecommendResponse | JSONResponse:
    s = state.settings
    k = k or s.default_k
    if k > s.max_k:
        return JSONResponse(status_code=422, content={
            "error": "invalid_request", "message": f"k: must be <= {s.max_k}", "request_id": request.state.request_id})
    rec = state.recommender
    history = state.store.history(user_id, rec.seq_len)

    def popular(n: int) -> list[tuple[str, float]]:
        # Live popularity from the store (fresh, knows new items); the bundle's when the store has none.
        # Asked for only when the fallback is taken, so ranked requests make one store round trip.
        return state.store.popular(n) or rec.bundle.popularity

    ranking = rec.rank(history, k, popular)
    return RecommendResponse(
        request_id=request.state.request_id, user_id=user_id, model_version=rec.model_version,
        strategy=ranking.strategy, history_len=len(history),
        items=[RecommendedItem(item_id=x.item_id, category_id=x.category_id, score=x.score) for x in ranking.items])


@router.get("/recommend", response_model=RecommendResponse)
def recommend_get(state: State, request: Request, user_id: Annotated[UserId, Query()],
                  k: Annotated[int | None, Query(ge=1)] = None):
    return _recommend(state, request, user_id, k)


@router.post("/recommend", response_model=RecommendResponse)
def recommend_post(state: State, request: Request, body: RecommendRequest):
    return _recommend(state, request, body.user_id, body.k)


@router.post("/events", response_model=EventsResponse, status_code=202)
def post_events(state: State, body: EventsRequest) -> EventsResponse:
    """Accept behaviour events. With the stream as sink they are journaled locally and sent in the
    background, so the request never waits for Kafka; 503 with Retry-After only when the journal is
    full. Send your own ``event_id`` and retry with the same one: it is the idempotency key."""
    if state.outbox is not None:
        state.outbox.put([event_record(e) for e in body.events])
    else:
        state.store.write(body.events)
    return EventsResponse(accepted=len(body.events), sink=state.settings.events_sink)


@router.get("/healthz")
def healthz() -> dict:
    return {"status": "ok"}


@router.get("/readyz")
def readyz(state: State):
    try:
        state.store.ping()
    except StoreUnavailable as exc:
        return JSONResponse(status_code=503, content={"status": "unavailable", "reason": str(exc)})
    return {"status": "ready", "model_version": state.recommender.model_version}
