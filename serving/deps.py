"""What request handlers depend on: the parts of the service state the lifespan built, each a named dependency."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

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
from dinrec.serving.turns import RankingTurns
from dinrec.streams import EventStream
from dinrec.streams.outbox import Outbox


@dataclass(frozen=True)
class RecommendParts:
    """What /recommend reads, as one dependency (it is the hot path: one lookup per request)."""

    settings: ServingSettings
    metrics: ServiceMetrics
    guardrail: Guardrail  # assigns the user to an experiment's variant
    models: ModelManager
    features: GuardedStore  # the store's reads, behind a circuit breaker
    impressions: ImpressionLog
    log_every_list: bool  # with the stream as sink every served list is logged; the store keeps only A/B ones
    turns: RankingTurns = field(default_factory=RankingTurns)  # one ranking per turn of the worker's loop


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
    recommending: RecommendParts

    @property
    def recommender(self) -> Recommender:
        """The model serving now (a request reads it once, when it starts: a swap mid-request is unseen).
        NoModelYet (503 no_model) while a new deployment waits for its first model."""
        return self.models.serving_or_raise()


def _part(name: str) -> Any:
    """A route's dependency on one part of the state (routes never receive the whole state)."""

    async def part(request: Request) -> Any:  # async: no thread-pool hop per request
        return getattr(request.app.state.dinrec, name)

    part.__name__ = f"{name}_part"
    return Depends(part)


Settings = Annotated[ServingSettings, _part("settings")]
Metrics = Annotated[ServiceMetrics, _part("metrics")]
Models = Annotated[ModelManager, _part("models")]
Running = Annotated[Guardrail, _part("guardrail")]  # the running experiments, as the guardrail's decisions stand
Counters = Annotated[ExperimentState, _part("experiment_state")]
Store = Annotated[OnlineStore, _part("store")]
Documents = Annotated[ExperimentsDocument | None, _part("experiments_doc")]
Journal = Annotated[Outbox | None, _part("outbox")]  # POST /events journals here when the sink is the stream
Quota = Annotated[UserQuota | None, _part("quota")]
Threads = Annotated[Mapping[str, Callable[[], bool]], _part("threads")]
Recommending = Annotated[RecommendParts, _part("recommending")]
