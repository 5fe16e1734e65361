"""What request handlers depend on: the service state the lifespan built, as a named dependency."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request

from dinrec.experiments import open_state
from dinrec.experiments.document import ExperimentsDocument
from dinrec.experiments.guardrail import Guardrail
from dinrec.experiments.running import Experiments
from dinrec.experiments.state import ExperimentState
from dinrec.feature_store.online import OnlineStore
from dinrec.feature_store.settings import FeatureStoreSettings
from dinrec.models.ranking import Recommender
from dinrec.serving.catalog import Catalog
from dinrec.serving.degraded import GuardedStore
from dinrec.serving.impressions import ImpressionLog
from dinrec.serving.metrics import ServiceMetrics
from dinrec.serving.models import ModelManager
from dinrec.serving.quotas import UserQuota
from dinrec.serving.settings import ServingSettings
from dinrec.streams import EventStream
from dinrec.streams.outbox import Outbox


@dataclass
class ServiceState:
    settings: ServingSettings
    fs_settings: FeatureStoreSettings
    store: OnlineStore
    stream: EventStream
    outbox: Outbox | None = None  # POST /events journals here when the sink is the stream
    metrics: ServiceMetrics = field(default_factory=ServiceMetrics)
    features: GuardedStore = field(init=False)  # the store's reads, behind a circuit breaker
    experiment_state: ExperimentState = field(init=False)  # A/B counters and decisions, beside the store
    models: ModelManager | None = None  # what serves, and hot reloads
    experiments: Experiments = field(default_factory=lambda: Experiments([]))
    experiments_doc: ExperimentsDocument | None = field(init=False)  # where they are kept (DINREC_EXPERIMENTS_FILE)
    guardrail: Guardrail | None = None  # stops a significantly worse variant (set at start-up)
    impressions: ImpressionLog | None = None  # every served list, one event per item (set at start-up)
    catalog: Catalog | None = None  # items the models do not know, polled from the store (set at start-up)
    quota: UserQuota | None = field(init=False)  # what one user id may send to POST /events
    ingest_stop: threading.Event = field(default_factory=threading.Event)
    ingest_thread: threading.Thread | None = None
    # The background threads answers depend on, by name: is each running? (readiness, dinrec_thread_alive)
    threads: dict[str, Callable[[], bool]] = field(default_factory=dict)

    def threads_down(self) -> list[str]:
        return sorted(name for name, alive in self.threads.items() if not alive())

    @property
    def recommender(self) -> Recommender:
        """The model serving now (a request reads it once, when it starts: a swap mid-request is unseen).
        NoModelYet (503 no_model) while a new deployment waits for its first model."""
        return self.models.serving_or_raise()  # type: ignore[union-attr]

    def __post_init__(self) -> None:
        s = self.settings
        self.features = GuardedStore(self.store, s.store_cooldown_s, popular_cache_s=s.popular_cache_s)
        self.experiment_state = open_state(self.store)
        self.quota = UserQuota(s.events_per_user_per_minute) if s.events_per_user_per_minute else None
        self.experiments_doc = ExperimentsDocument.open(s.experiments_file) if s.experiments_file else None


async def get_state(request: Request) -> ServiceState:  # async: no thread-pool hop per request
    return request.app.state.dinrec


State = Annotated[ServiceState, Depends(get_state)]
