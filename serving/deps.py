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
from serving.ranking import Recommender
from serving.settings import ServingSettings


@dataclass
class ServiceState:
    settings: ServingSettings
    fs_settings: FeatureStoreSettings
    recommender: Recommender
    store: OnlineStore
    stream: EventStream
    outbox: Outbox | None = None  # POST /events journals here when the sink is the stream
    features: GuardedStore = field(init=False)  # the store's reads, behind a circuit breaker

    def __post_init__(self) -> None:
        self.features = GuardedStore(self.store, self.settings.store_cooldown_s)
    ingest_stop: threading.Event = field(default_factory=threading.Event)
    ingest_thread: threading.Thread | None = None


def get_state(request: Request) -> ServiceState:
    return request.app.state.dinrec


State = Annotated[ServiceState, Depends(get_state)]
