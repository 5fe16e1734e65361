"""What request handlers depend on: the service state the lifespan built, as a named dependency."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from dinrec.experiments.document import ExperimentsDocument
from dinrec.experiments.guardrail import Guardrail
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


@dataclass(frozen=True)
class ServiceState:
    """The service's parts, each built and started before this value exists (serving.app.start_service), none
    replaced after: what changes while the service runs lives inside a part that owns the change — the model
    serving (``models``: hot reload), the running experiments (``guardrail.experiments``: the admin API and
    the document watcher swap them), the catalog's new items."""

    settings: ServingSettings
    fs_settings: FeatureStoreSettings
    store: OnlineStore
    stream: EventStream
    outbox: Outbox | None  # POST /events journals here when the sink is the stream
    metrics: ServiceMetrics
    features: GuardedStore  # the store's reads, behind a circuit breaker
    experiment_state: ExperimentState  # A/B counters and decisions, beside the store
    models: ModelManager  # what serves, and hot reloads
    experiments_doc: ExperimentsDocument | None  # where experiments are kept (DINREC_EXPERIMENTS_FILE)
    guardrail: Guardrail  # assigns users to the running experiments and stops a significantly worse variant
    impressions: ImpressionLog  # every served list, one event per item
    catalog: Catalog  # items the models do not know, polled from the store
    quota: UserQuota | None  # what one user id may send to POST /events
    # The background threads answers depend on, by name: is each running? (readiness, dinrec_thread_alive)
    threads: Mapping[str, Callable[[], bool]]

    def threads_down(self) -> list[str]:
        return sorted(name for name, alive in self.threads.items() if not alive())

    @property
    def recommender(self) -> Recommender:
        """The model serving now (a request reads it once, when it starts: a swap mid-request is unseen).
        NoModelYet (503 no_model) while a new deployment waits for its first model."""
        return self.models.serving_or_raise()


async def get_state(request: Request) -> ServiceState:  # async: no thread-pool hop per request
    return request.app.state.dinrec


State = Annotated[ServiceState, Depends(get_state)]
