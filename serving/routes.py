"""HTTP routes.

``/recommend`` runs inline on the event loop (``async def`` doing blocking work): a request is a few
milliseconds of CPU, and a worker process per core serving one request at a time beats handing each
to a thread pool, where 40 threads contend for the GIL and the cores and a burst turns into long
tails. Its blocking calls are bounded (Redis timeouts, the breaker). One request ranks per turn of the
loop (serving.turns), so new requests are read — and shed — between any two. The other handlers are
sync (``def``) and run in FastAPI's thread pool."""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from dataclasses import dataclass
from typing import Annotated

import orjson
from fastapi import APIRouter, Header, Query, Request, Response
from starlette.exceptions import HTTPException

from dinrec.events.features import HistoryItem
from dinrec.events.schema import BehaviourEvent, ExternalId
from dinrec.experiments.spec import Experiment, Overrides, Variant
from dinrec.feature_store.errors import StoreUnavailable
from dinrec.models.ranking import Ranking, Recommender
from dinrec.serving.admin import is_admin
from dinrec.serving.deps import Journal, Metrics, Models, Quota, Recommending, RecommendParts, Settings, Store, Threads
from dinrec.serving.errors import InvalidRequest, error_response
from dinrec.serving.impressions import ServedList
from dinrec.serving.metrics import ServiceMetrics
from dinrec.serving.quotas import UserQuota
from dinrec.serving.schemas import (
    ContextItem,
    Degraded,
    EventsRequest,
    EventsResponse,
    RecommendRequest,
    RecommendResponse,
    UserId,
)
from dinrec.serving.settings import ServingSettings
from dinrec.streams.base import event_record

log = logging.getLogger(__name__)
router = APIRouter()


def _then_bundle(live: list[tuple[str, float]], bundled: list[tuple[str, float]]) -> list[tuple[str, float]]:
    """Live popularity, then the bundle's items it lacks, scored below the live ones (a live count and
    a training count are not on one scale, so the order between the two parts is what counts)."""
    have = {item for item, _ in live}
    floor = min((n for _, n in live), default=1.0)
    peak = max((n for _, n in bundled), default=1.0) or 1.0
    return live + [(item, floor * n / peak * 0.999) for item, n in bundled if item not in have]


def _recommend(p: RecommendParts, request: Request, user_id: str, k: int | None, *, operator: bool,
               explain: bool = False, shown: list[str] | None = None,
               context: list[ContextItem] | None = None) -> Response:
    """assign → features → rank (or fall back) → log → render; each stage says its own degradation, if any."""
    k = k or p.settings.default_k
    if k > p.settings.max_k:
        raise InvalidRequest(f"k: must be <= {p.settings.max_k}", field="k")
    cpu = p.metrics.recommend_cpu
    c0 = time.thread_time()  # what each stage costs the worker (it runs them inline, one request at a time)
    experiment, variant, rec = _assign(p, user_id)
    overrides = variant.overrides if variant else None
    started = getattr(request.state, "started", None) or time.perf_counter()  # the deadline counts from here
    c1 = time.thread_time()
    history, seen, without_store = _features(p, rec, user_id, overrides, context)
    c2 = time.thread_time()
    plan = RankPlan(k, started, overrides, explain, frozenset(shown or ()), seen)
    ranking, fell_back = _rank(p, rec, user_id, history, plan)
    c3 = time.thread_time()
    reasons = [r for r in (without_store, fell_back) if r is not None]
    for stage, seconds in ranking.seconds.items():
        p.metrics.stages.labels(stage).observe(seconds)
    exp_name, variant_name = (experiment.name, variant.name) if experiment and variant else (None, None)
    if exp_name or p.log_every_list:
        p.impressions.log(ServedList(request.state.request_id, user_id,
                                     [(x.item_id, x.category_id) for x in ranking.items], exp_name,
                                     variant_name, rec.model_version, time.time(), degraded=bool(reasons),
                                     latency_ms=1000 * (time.perf_counter() - started),
                                     tail_items=sum(rec.long_tail(x.item_id) for x in ranking.items)))
    for reason in reasons:
        p.metrics.degraded.labels(reason).inc()
    c4 = time.thread_time()
    response = _render(request, user_id, ranking, reasons, {
        "model_version": rec.model_version, "strategy": ranking.strategy, "history_len": len(history),
        "experiment": exp_name, "variant": variant_name} if operator else None)
    # select: ranking's rules, lanes and list building — all of ranking but recall and scoring
    for stage, seconds in (("assign", c1 - c0), ("features", c2 - c1), *ranking.cpu_seconds.items(),
                           ("select", c3 - c2 - sum(ranking.cpu_seconds.values())), ("log", c4 - c3),
                           ("encode", time.thread_time() - c4)):
        cpu.labels(stage).inc(max(seconds, 0.0))
    return response


def _assign(p: RecommendParts, user_id: str) -> tuple[Experiment | None, Variant | None, Recommender]:
    """The user's experiment and variant as the guardrail's decisions stand (a stopped variant's or a
    concluded experiment's users get the default experience; a ramp takes those within its step), and
    the model that serves them."""
    assigned = p.guardrail.assign(user_id)
    experiment, variant = assigned if assigned else (None, None)
    rec = p.models.serving_or_raise()  # read once: a swap mid-request is unseen (503 no_model before the first)
    if variant and variant.model:  # the variant serves its own model
        rec = p.models.variant_model(variant.model)
    return experiment, variant, rec


def _features(p: RecommendParts, rec: Recommender, user_id: str, overrides: Overrides | None,
              context: list[ContextItem] | None) -> tuple[list[HistoryItem], set[str], Degraded | None]:
    """The user's history (the store's; the request's own context when the store is down or slow, said by
    the third value) and the items the seen-item policy keeps out of the list."""
    t0 = time.perf_counter()
    if rec.settings.seen_policy == "all":  # the history and every item the user took, in one read
        read = p.features.history_and_interacted(user_id, rec.seq_len)
        history, interacted = read if read is not None else (None, frozenset())
    else:
        history, interacted = p.features.history(user_id, rec.seq_len), frozenset()
    p.metrics.stages.labels("features").observe(time.perf_counter() - t0)
    degraded = None
    if history is None:
        degraded = Degraded.feature_store
        history = [HistoryItem(0.0, f"context-{i}", c.item_id, c.category_id) for i, c in enumerate(context or [])]
    seen = rec.seen_items(history, interacted)
    if overrides and overrides.seq_len:  # the variant looks at fewer behaviours (20 vs 50, say)
        history = history[-overrides.seq_len:]
    return history, seen, degraded


@dataclass(frozen=True)
class RankPlan:
    """What one request asks of the ranking stage."""

    k: int
    started: float  # perf_counter when the request began: its deadline counts from here
    overrides: Overrides | None  # the variant's (strategy, recall candidates, tail share)
    explain: bool
    shown: frozenset[str]  # items the client showed already: not again
    seen: set[str]  # items the seen-item policy keeps out


def _rank(p: RecommendParts, rec: Recommender, user_id: str, history: list[HistoryItem],
          plan: RankPlan) -> tuple[Ranking, Degraded | None]:
    """DIN's list (or the popularity variant's); the bundle's popularity when the request is past its
    deadline or ranking fails (said by the second value) — always an answer."""

    def popular(n: int) -> list[tuple[str, float]]:
        # Live popularity from the store (fresh, knows new items), then the bundle's after it, so a
        # store that has seen few items still fills the list. Asked for only when a list needs it.
        return _then_bundle(p.features.popular(n) or [], rec.bundle.popularity)

    o = plan.overrides
    if time.perf_counter() - plan.started > p.settings.request_deadline_ms / 1000:
        degraded = Degraded.deadline  # the store answered, but too late to rank: no further call
    elif o and o.strategy == "popular":  # the variant is the non-model baseline
        return rec.rank_by_popularity(history, plan.k, popular, shown=plan.shown, seen=plan.seen), None
    else:
        try:
            return rec.rank(history, plan.k, popular, shown=plan.shown, explain=plan.explain,
                            candidates=o.recall_candidates if o else None, tail_share=o.tail_share if o else None,
                            seen=plan.seen), None
        except Exception:  # recall or model failure: still an answer, from the bundle's popularity
            log.exception("ranking failed for user %r; answering with popular items", user_id)
            degraded = Degraded.ranking
    fallback = rec.rank_by_popularity(history, plan.k, lambda n: rec.bundle.popularity, shown=plan.shown,
                                      seen=plan.seen)
    return fallback, degraded


def _render(request: Request, user_id: str, ranking: Ranking, reasons: list[Degraded],
            operator: dict | None) -> Response:
    """``operator``: what only the operator's answers carry (OPERATOR_FIELDS)."""
    # Built as JSON here, not through the response model: validating and encoding the model again
    # costs more than ranking's Python work; tests hold these keys to RecommendResponse's schema.
    return Response(orjson.dumps({
        "request_id": request.state.request_id, "user_id": user_id,
        "items": [{"item_id": x.item_id, "category_id": x.category_id, "score": x.score,
                   "because": None if x.because is None else [
                       {"item_id": b.item_id, "category_id": b.category_id, "weight": b.weight} for b in x.because]}
                  for x in ranking.items],
        "degraded": bool(reasons), "degraded_reasons": reasons, **(operator or {})}),
        media_type="application/json")


def _as_principal(settings: ServingSettings, request: Request, user_ids: set[str]) -> None:
    """With DINREC_USER_HEADER the gateway says who the caller is: a request may name that user only
    (else anyone could read or write any user's history by naming them)."""
    header = settings.user_header
    if header is None:
        return
    values = request.headers.getlist(header)
    if len(values) > 1:  # a gateway that appends its header would let the client's own copy win
        raise HTTPException(400, f"the {header} header occurs {len(values)} times: the gateway sets it once")
    principal = values[0] if values else None
    if not principal:
        raise HTTPException(401, f"the {header} header (set by the gateway) is required")
    if user_ids - {principal.strip()}:
        raise HTTPException(403, f"a request may name only its own user (the {header} header)")


def _within_quota(quota: UserQuota, metrics: ServiceMetrics, per_minute: int | None,
                  events_by_user: Counter[str]) -> None:
    wait = quota.take(events_by_user)
    if not wait:
        return
    metrics.over_quota.inc()
    if math.isinf(wait):
        raise HTTPException(429, f"one user's events in this request exceed a minute's quota ({per_minute} a "
                                 "minute, DINREC_EVENTS_PER_USER_PER_MINUTE): send them over time")
    seconds = math.ceil(wait)
    raise HTTPException(429, f"a user of this request is over its quota of {per_minute} events a minute: retry "
                             f"in {seconds} s; nothing was accepted", headers={"Retry-After": str(seconds)})


def _may_explain(settings: ServingSettings, authorization: str | None) -> None:
    """``explain`` answers with the user's own recent behaviours: anyone who could ask for any user id
    could read every user's history. By default only callers holding the admin token may."""
    policy = settings.explain
    if policy == "public" or (policy == "admin" and is_admin(settings, authorization)):
        return
    raise HTTPException(403, "explain names the user's own behaviours: " + (
        "it is off (DINREC_EXPLAIN=off)" if policy == "off" else
        "send `Authorization: Bearer <DINREC_ADMIN_TOKEN>`, or set DINREC_EXPLAIN=public behind a gateway "
        "that authenticates users"))


@router.get("/recommend", response_model=RecommendResponse)
async def recommend_get(p: Recommending, request: Request, user_id: Annotated[UserId, Query()],
                        k: Annotated[int | None, Query(ge=1)] = None, explain: bool = False,
                        shown: Annotated[list[ExternalId] | None, Query(max_length=500)] = None,
                        authorization: Annotated[str | None, Header()] = None):
    _as_principal(p.settings, request, {user_id})
    if explain:
        _may_explain(p.settings, authorization)
    async with p.turns:
        return _recommend(p, request, user_id, k, operator=is_admin(p.settings, authorization), explain=explain,
                          shown=shown)


@router.post("/recommend", response_model=RecommendResponse)
async def recommend_post(p: Recommending, request: Request, body: RecommendRequest,
                         authorization: Annotated[str | None, Header()] = None):
    _as_principal(p.settings, request, {body.user_id})
    if body.explain:
        _may_explain(p.settings, authorization)
    async with p.turns:
        return _recommend(p, request, body.user_id, body.k, operator=is_admin(p.settings, authorization),
                          explain=body.explain, shown=body.shown, context=body.context)


# What only the service writes: impressions come from the served lists (serving/impressions.py), with
# the experiment, variant, position and model the server assigned. A client that could send them could
# count impressions for any arm, and through the A/B sums stop a variant or promote a model.
_SERVER_ONLY = ("experiment", "variant", "position", "model_version")


def _refuse_what_clients_may_not_send(events: list[BehaviourEvent], max_future_s: float) -> None:
    latest, problems = time.time() + max_future_s, []
    for i, e in enumerate(events):
        if "event_id" not in e.model_fields_set:
            problems.append((f"events.{i}.event_id", "required: the idempotency key a retry sends again"))
        if e.event_type == "impression":
            problems.append((f"events.{i}.event_type", "impressions are logged by the service, not sent"))
        problems += [(f"events.{i}.{name}", "set by the service, not by clients")
                     for name in _SERVER_ONLY if getattr(e, name) is not None]
        if e.ts > latest:
            problems.append((f"events.{i}.ts", f"more than {max_future_s:g}s ahead of the server's clock"))
    if problems:
        summary = "; ".join(f"{field}: {message}" for field, message in problems[:5])
        raise InvalidRequest(summary + ("; …" if len(problems) > 5 else ""), problems=problems[:100])


@router.post("/events", response_model=EventsResponse, status_code=202)
def post_events(settings: Settings, store: Store, journal: Journal, quota: Quota, metrics: Metrics, request: Request,
                body: EventsRequest, authorization: Annotated[str | None, Header()] = None) -> EventsResponse:
    """Accept behaviour events (views, clicks, carts, …; a click names the ``request_id`` of the answer it
    came from). With the stream as sink they are journaled locally and sent in the background, so the
    request never waits for Kafka; 503 with Retry-After only when the journal is full. ``event_id`` is
    required: it is the idempotency key, sent again with a retry. Impressions and the A/B fields are the
    service's own (422); so is a ``ts`` ahead of the server's clock. One user id may send
    ``DINREC_EVENTS_PER_USER_PER_MINUTE`` (serving.quotas): more, 429 and nothing accepted."""
    _as_principal(settings, request, {e.user_id for e in body.events})
    _refuse_what_clients_may_not_send(body.events, settings.events_max_future_s)
    if quota is not None and not is_admin(settings, authorization):
        _within_quota(quota, metrics, settings.events_per_user_per_minute, Counter(e.user_id for e in body.events))
    if journal is not None:
        journal.put([event_record(e) for e in body.events])
    else:
        store.write(body.events)
    return EventsResponse(accepted=len(body.events), sink=settings.events_sink)


@router.get("/metrics", include_in_schema=False)
def metrics(service_metrics: Metrics) -> Response:
    from prometheus_client import CONTENT_TYPE_LATEST

    return Response(service_metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/healthz")
async def healthz() -> dict:
    return {"status": "ok"}


@router.get("/readyz")
def readyz(store: Store, metrics: Metrics, threads: Threads, models: Models, journal: Journal, request: Request):
    """Ready when a model serves, the background threads answers depend on run (impression logging,
    the outbox's sender, the in-app ingest) and the event journal accepts events. The feature store is
    reported (``store``, and ``dinrec_store_up``) but is no reason to leave the load balancer: without it
    answers are degraded, not refused, and a store outage must not take every replica out at once."""
    try:
        store.ping()
        answer = "ok"
    except StoreUnavailable as exc:
        log.warning("readiness: %s", exc)
        answer = "unavailable"
    metrics.store_up.set(answer == "ok")
    down = sorted(name for name, alive in threads.items() if not alive())
    if down:
        return error_response(503, "not_ready", f"background threads not running: {', '.join(down)}", request,
                              threads_down=down, store=answer)
    waiting = models.waiting()
    if waiting is not None:  # a new deployment before its first model: not ready, and why
        return error_response(503, "not_ready", waiting, request, store=answer)
    problem = journal.journal_problem() if journal is not None else None
    if problem is not None:  # POST /events would answer 503: send its clients to a replica that accepts them
        return error_response(503, "not_ready", f"the event journal is failing: {problem}", request, store=answer)
    return {"status": "ready", "model_version": models.serving_or_raise().model_version, "store": answer}
