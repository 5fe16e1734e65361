"""What request handlers depend on: the service state the lifespan built, as a named dependency."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request

from feature_store.online import OnlineStore
from feature_store.outbox import Outbox
from feature_store.settings import FeatureStoreSettings
from feature_store.streams import EventStream
from serving.degraded import GuardedStore
from serving.experiments import Experiments
from serving.guardrail import Guardrail
from serving.impressions import ImpressionLog
from serving.metrics import ServiceMetrics
from serving.models import ModelManager
from serving.ranking import Recommender
from serving.rerank import Reranker
from serving.settings import ServingSettings


@dataclass
class ServiceState:
    settings: ServingSettings
    fs_settings: FeatureStoreSettings
    recommender: Recommender
    store: OnlineStore
    stream: EventStream
    outbox: Outbox | None = None  # POST /events journals here when the sink is the stream
    metrics: ServiceMetrics = field(default_factory=ServiceMetrics)
    features: GuardedStore = field(init=False)  # the store's reads, behind a circuit breaker
    reranker: Reranker = field(init=False)

    def __post_init__(self) -> None:
        s = self.settings
        self.features = GuardedStore(self.store, s.store_cooldown_s)
        self.reranker = Reranker(s.max_per_category, s.blocked_items, s.blocked_categories, s.shown_penalty,
                                 s.tail_share)
    models: ModelManager | None = None  # what serves, and hot reloads (set by the lifespan)
    experiments: Experiments = field(default_factory=lambda: Experiments([]))
    guardrail: Guardrail | None = None  # stops a significantly worse variant (set by the lifespan)
    impressions: ImpressionLog | None = None  # every served list, one event per item (set by the lifespan)
    ingest_stop: threading.Event = field(default_factory=threading.Event)
    ingest_thread: threading.Thread | None = None


async def get_state(request: Request) -> ServiceState:  # async: no thread-pool hop per request
    return request.app.state.dinrec


State = Annotated[ServiceState, Depends(get_state)]
