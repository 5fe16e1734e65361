"""`create_app(settings)`: the FastAPI service. The lifespan loads the bundle, the FAISS index,
the online store and the event stream; nothing happens at import."""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from feature_store.ingest import Ingestor
from feature_store.online import OnlineStore, open_store
from feature_store.outbox import open_outbox
from feature_store.settings import FeatureStoreSettings
from feature_store.streams import EventStream, open_stream
from feature_store.streams.base import event_record
from serving import logs
from serving.ab_routes import router as ab_router
from serving.admin import router as admin_router
from serving.admin_experiments import router as admin_experiments_router
from serving.admin_experiments import watch_file as watch_experiments
from serving.catalog import Catalog
from serving.deps import ServiceState
from serving.errors import install_error_handlers
from serving.experiments import Experiments
from serving.guardrail import Guardrail
from serving.impressions import ImpressionLog
from serving.middleware import RequestContext
from serving.models import ModelManager
from serving.ranking import Recommender
from serving.routes import router
from serving.settings import ServingSettings

log = logging.getLogger(__name__)


def create_app(settings: ServingSettings, fs_settings: FeatureStoreSettings | None = None, *,
               store: OnlineStore | None = None, stream: EventStream | None = None) -> FastAPI:
    """Build the service. ``store``/``stream`` may be passed in (the demo shares them); by default
    they are opened from ``fs_settings`` in the lifespan and closed after it."""
    fs_settings = fs_settings or FeatureStoreSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owned_store, owned_stream = store is None, stream is None

        def swapped(rec: Recommender) -> None:  # requests read state.recommender once, when they start
            state.recommender = rec
            state.metrics.serving_model(rec.model_version, rec.precision)

        # New items the store's catalog knows and the models do not: every model loaded gets them.
        catalog = Catalog(known=lambda item: models.current.knows(item),
                          apply=lambda items: [rec.set_cold_items(items) for rec in models.serving()])
        models = ModelManager(settings, on_swap=swapped, prepare=lambda rec: rec.set_cold_items(catalog.items))
        state = ServiceState(settings, fs_settings, models.current,
                             store or open_store(fs_settings), stream or open_stream(fs_settings), models=models)
        watch_stop = threading.Event()
        models.watch(watch_stop)
        if settings.events_sink == "stream":
            state.outbox = open_outbox(state.stream, fs_settings)
        state.experiments = Experiments.load(settings.experiments_file)
        models.load_variants(state.experiments.models())  # a variant must serve what it names, or no start
        state.guardrail = Guardrail(state.store, state.experiments, min_users=settings.guardrail_min_users,
                                    interval_s=settings.guardrail_interval_s,
                                    promote=models.promote if models.registry is not None else None)
        if settings.experiments_file is not None:  # experiments may also arrive later, by the admin API
            try:  # decisions other replicas already made apply from the first request
                state.guardrail.check()
            except Exception as exc:  # noqa: BLE001 - the store may be down at start; the loop retries
                log.warning("guardrail: first check failed: %s", exc)
            state.guardrail.run(watch_stop)
        watch_experiments(state, watch_stop)
        if settings.catalog_poll_s > 0:
            catalog.run(state.store, watch_stop, settings.catalog_poll_s)
        sink = ((lambda events: state.outbox.put([event_record(e) for e in events])) if state.outbox is not None
                else state.store.write)
        state.impressions = ImpressionLog(sink, on_drop=state.metrics.impressions_dropped.inc)
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
        state.metrics.serving_model(state.recommender.model_version, state.recommender.precision)
        if state.outbox is not None:
            state.metrics.watch_outbox(lambda: state.outbox.pending_bytes)
        app.state.dinrec = state
        # The bundle's vocabularies are millions of long-lived objects: out of the collector's sight,
        # a full collection no longer walks them in the middle of a request.
        gc.collect()
        gc.freeze()
        log.info("serving model %s (%s) from %s", state.recommender.model_version, state.recommender.precision,
                 settings.bundle_dir)
        try:
            yield
        finally:
            watch_stop.set()
            state.impressions.close()  # into the outbox (or store) before the outbox drains
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

    app.add_middleware(RequestContext, max_body_bytes=settings.max_body_bytes)
    install_error_handlers(app)
    app.include_router(router)
    app.include_router(admin_router)
    app.include_router(ab_router)
    app.include_router(admin_experiments_router)
    return app


def app_from_env() -> FastAPI:
    """The app with settings from the environment: what each `dinrec serve --workers N` process runs."""
    settings = ServingSettings()
    logs.configure(settings.log_format)
    return create_app(settings, FeatureStoreSettings())
