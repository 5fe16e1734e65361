"""`create_app(settings)`: the FastAPI service. The lifespan loads the bundle, the FAISS index,
the online store and the event stream; nothing happens at import."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request

from feature_store.ingest import Ingestor
from feature_store.online import OnlineStore, open_store
from feature_store.outbox import open_outbox
from feature_store.settings import FeatureStoreSettings
from feature_store.streams import EventStream, open_stream
from retrieval.index import FaissIndex
from serving.deps import ServiceState
from serving.errors import install_error_handlers
from serving.ranking import Recommender
from serving.routes import router
from serving.settings import ServingSettings
from training.bundle import load_bundle

log = logging.getLogger(__name__)


def _load_recommender(settings: ServingSettings) -> Recommender:
    bundle = load_bundle(settings.bundle_dir)
    index = FaissIndex.load(bundle.item_index_path)
    return Recommender(bundle, index, settings.recall_candidates, settings.score_precision)


def create_app(settings: ServingSettings, fs_settings: FeatureStoreSettings | None = None, *,
               store: OnlineStore | None = None, stream: EventStream | None = None) -> FastAPI:
    """Build the service. ``store``/``stream`` may be passed in (the demo shares them); by default
    they are opened from ``fs_settings`` in the lifespan and closed after it."""
    fs_settings = fs_settings or FeatureStoreSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owned_store, owned_stream = store is None, stream is None
        state = ServiceState(settings, fs_settings, _load_recommender(settings),
                             store or open_store(fs_settings), stream or open_stream(fs_settings))
        if settings.events_sink == "stream":
            state.outbox = open_outbox(state.stream, fs_settings)
        in_app = settings.ingest_in_app if settings.ingest_in_app is not None else fs_settings.stream == "inprocess"
        if in_app:
            ingestor = Ingestor(state.stream, state.store, fs_settings.consumer_group,
                                batch_size=fs_settings.ingest_batch)

            def _ingest() -> None:
                try:
                    ingestor.run(state.ingest_stop, poll_timeout_s=0.2)
                finally:
                    ingestor.close()

            state.ingest_thread = threading.Thread(target=_ingest, name="dinrec-ingest", daemon=True)
            state.ingest_thread.start()
        app.state.dinrec = state
        log.info("serving model %s from %s", state.recommender.model_version, settings.bundle_dir)
        try:
            yield
        finally:
            if state.outbox is not None:  # what it cannot send in time stays journaled for the next start
                state.outbox.close(drain_timeout_s=settings.shutdown_drain_s)
            state.ingest_stop.set()
            if state.ingest_thread is not None:
                state.ingest_thread.join(timeout=10)
            if owned_stream:
                state.stream.close()
            if owned_store:
                state.store.close()

    app = FastAPI(title="dinrec", version="0.1.0", lifespan=lifespan,
                  description="DIN recommendations: FAISS recall, DIN ranking, behaviour events.")

    @app.middleware("http")
    async def request_id(request: Request, call_next):
        rid = request.headers.get("x-request-id") or uuid.uuid4().hex
        request.state.request_id = rid[:64]
        response = await call_next(request)
        response.headers["x-request-id"] = request.state.request_id
        return response

    install_error_handlers(app)
    app.include_router(router)
    return app
