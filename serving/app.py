"""`create_app(settings)`: the FastAPI service. The lifespan loads the bundle, the FAISS index,
the online store and the event stream; nothing happens at import."""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import ExitStack, asynccontextmanager

from fastapi import FastAPI

from dinrec.experiments import open_state
from dinrec.experiments.document import ExperimentsDocument
from dinrec.experiments.guardrail import Guardrail
from dinrec.experiments.running import Experiments
from dinrec.feature_store.errors import StoreUnavailable
from dinrec.feature_store.ingest import Ingestor
from dinrec.feature_store.online import OnlineStore, open_store
from dinrec.feature_store.settings import FeatureStoreSettings
from dinrec.serving import logs
from dinrec.serving.ab_routes import router as ab_router
from dinrec.serving.admin import router as admin_router
from dinrec.serving.admin_catalog import router as admin_catalog_router
from dinrec.serving.admin_experiments import router as admin_experiments_router
from dinrec.serving.admin_experiments import watch_document
from dinrec.serving.allocator import limit_arenas
from dinrec.serving.catalog import Catalog
from dinrec.serving.degraded import GuardedStore
from dinrec.serving.deps import RecommendParts, ServiceState
from dinrec.serving.errors import install_error_handlers
from dinrec.serving.http_timeouts import READ_TIMEOUT_KEY
from dinrec.serving.impressions import ImpressionLog
from dinrec.serving.liveness import start_liveness
from dinrec.serving.metrics import ServiceMetrics
from dinrec.serving.middleware import RequestContext
from dinrec.serving.models import ModelManager
from dinrec.serving.quotas import UserQuota
from dinrec.serving.replica import ReplicaLead
from dinrec.serving.routes import router
from dinrec.serving.settings import ServingSettings, is_loopback
from dinrec.storage.loops import every, supervise
from dinrec.streams import EventStream, open_stream
from dinrec.streams.base import event_record
from dinrec.streams.outbox import open_outbox

log = logging.getLogger(__name__)


def create_app(settings: ServingSettings, fs_settings: FeatureStoreSettings | None = None, *,
               store: OnlineStore | None = None, stream: EventStream | None = None) -> FastAPI:
    """Build the service. ``store``/``stream`` may be passed in (the demo shares them); by default
    they are opened from ``fs_settings`` in the lifespan and closed after it."""
    fs_settings = fs_settings or FeatureStoreSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict]:
        with ExitStack() as parts:  # each part registers its own stop; they stop in reverse start order
            app.state.dinrec = start_service(parts, settings, fs_settings, store, stream)
            if settings.health_port is not None:
                app.state.liveness = start_liveness(parts, settings.host, settings.health_port,
                                                    settings.liveness_max_stall_s)
            # read by serving.http_timeouts' protocol (uvicorn hands it the lifespan's state)
            yield {READ_TIMEOUT_KEY: settings.request_read_timeout_s}

    app = FastAPI(title="dinrec", version="0.1.0", lifespan=lifespan,
                  description="DIN recommendations: FAISS recall, DIN ranking, behaviour events.")

    app.add_middleware(RequestContext, max_body_bytes=settings.max_body_bytes, max_in_flight=settings.max_in_flight,
                       body_timeout_s=settings.request_body_timeout_s,
                       max_body_reads_per_client=settings.max_body_reads_per_client)
    install_error_handlers(app)
    app.include_router(router)
    app.include_router(admin_router)
    app.include_router(ab_router)
    app.include_router(admin_experiments_router)
    app.include_router(admin_catalog_router)
    return app


def app_from_env() -> FastAPI:
    """The app with settings from the environment: what each `dinrec serve --workers N` process runs."""
    settings = ServingSettings()
    logs.configure(settings.log_format)
    return create_app(settings, FeatureStoreSettings())


def start_service(parts: ExitStack, settings: ServingSettings, fs_settings: FeatureStoreSettings,
                  store: OnlineStore | None, stream: EventStream | None) -> ServiceState:
    """Start the service's parts in dependency order, each registering its stop on ``parts``: the store
    and the stream, the in-app ingest, the models, the outbox, the impression log, then the background
    loops (models, experiments, guardrail, catalog). Stopping runs the other way: loops first, then
    impressions into the outbox, the outbox drained into the stream, ingest, the stream, the store."""
    limit_arenas(settings.malloc_arenas)  # before the threads that serve start
    if store is None:
        store = open_store(fs_settings)
        parts.callback(store.close)
    try:  # data in another layout (an older one, another partition count) stops the start, loudly
        store.check_layout()
    except StoreUnavailable as exc:  # down at start: serve degraded; reads check it once it answers
        log.warning("store layout not checked at start: %s", exc)
    if stream is None:
        stream = open_stream(fs_settings)
        parts.callback(stream.close)
    metrics = ServiceMetrics()
    # new items the store knows and the models do not: every model loaded gets them
    catalog = Catalog(per_category=settings.cold_items_per_category)
    models = ModelManager(settings, on_swap=metrics.serving_model,
                          prepare=lambda rec: rec.set_cold_items(catalog.items))
    catalog.attach(models)
    threads: dict[str, Callable[[], bool]] = {}
    _start_ingest(parts, settings, fs_settings, store, stream, metrics, threads)
    outbox = None
    if settings.events_sink == "stream":
        outbox = open_outbox(stream, fs_settings)
        # What it cannot send in time stays journaled for the next start.
        parts.callback(outbox.close, drain_timeout_s=settings.shutdown_drain_s)
        metrics.watch_outbox(lambda: outbox.pending_bytes)
        threads["dinrec-outbox"] = lambda: outbox.sender_alive
    experiment_state = open_state(store)
    sink = (lambda events: outbox.put([event_record(e) for e in events])) if outbox is not None else store.write
    impressions = ImpressionLog(sink, on_drop=metrics.impressions_dropped.inc, on_served=experiment_state.add_served)
    parts.callback(impressions.close)  # into the outbox (or store) before the outbox drains
    threads["dinrec-impressions"] = lambda: impressions.alive
    metrics.watch_threads(threads)
    experiments_doc = ExperimentsDocument.open(settings.experiments_file) if settings.experiments_file else None
    experiments = Experiments.of(experiments_doc.read()[0]) if experiments_doc is not None else Experiments([])
    models.load_variants(experiments.models())  # a variant must serve what it names, or no start
    guardrail = Guardrail(experiment_state, experiments, min_users=settings.guardrail_min_users,
                          interval_s=settings.guardrail_interval_s,
                          promote=models.promote if models.registry is not None else None,
                          auto_promote=settings.auto_promote == "always" or settings.user_header is not None)
    metrics.watch_guardrail(lambda: {exp.name: float(len(guardrail.held(exp.name)))
                                     for exp in guardrail.experiments.all if exp.status == "running"})
    features = GuardedStore(store, settings.store_cooldown_s, popular_cache_s=settings.popular_cache_s)
    state = ServiceState(
        settings=settings, fs_settings=fs_settings, store=store, stream=stream, outbox=outbox, metrics=metrics,
        features=features, experiment_state=experiment_state, models=models, experiments_doc=experiments_doc,
        guardrail=guardrail, impressions=impressions, catalog=catalog,
        quota=UserQuota(settings.events_per_user_per_minute) if settings.events_per_user_per_minute else None,
        threads=threads, recommending=RecommendParts(settings, metrics, guardrail, models, features, impressions,
                                                     log_every_list=outbox is not None))
    _start_loops(parts, state, catalog)
    rec = models.current
    if rec is None:  # the watcher loads the first model the alias names (serving.models)
        log.warning("started without a model; events are accepted meanwhile. %s", models.waiting())
        return state
    metrics.serving_model(rec)
    # The bundle's vocabularies are millions of long-lived objects: out of the collector's sight,
    # a full collection no longer walks them in the middle of a request.
    gc.collect()
    gc.freeze()
    log.info("serving model %s from %s; timed fastest here: scorer %s (%s), recall index %s (%s)", rec.model_version,
             settings.bundle_dir, rec.scorer.impl, rec.scorer_choice.timings_ms, rec.index.kind, rec.index_choice)
    return state


def _start_ingest(parts: ExitStack, settings: ServingSettings, fs: FeatureStoreSettings, store: OnlineStore,
                  stream: EventStream, metrics: ServiceMetrics, threads: dict[str, Callable[[], bool]]) -> None:
    """The stream → store consumer inside the service (the embedded default: the in-process stream
    lives in this process, so nothing else could consume it)."""
    if not (settings.ingest_in_app if settings.ingest_in_app is not None else fs.stream == "inprocess"):
        return
    ingestor = Ingestor(stream, store, fs.consumer_group, batch_size=fs.ingest_batch)
    ingest_stop = threading.Event()
    restarts = metrics.thread_restarts.labels("dinrec-ingest")
    thread = supervise(lambda: ingestor.run(ingest_stop, poll_timeout_s=0.2), ingest_stop,
                       name="dinrec-ingest", on_restart=restarts.inc)
    threads["dinrec-ingest"] = thread.is_alive

    def stop() -> None:
        ingest_stop.set()
        thread.join(timeout=10)
        ingestor.close()

    parts.callback(stop)


def _start_loops(parts: ExitStack, state: ServiceState, catalog: Catalog) -> None:
    """The background loops, stopped together first: the model watcher, the experiments file
    watcher, the guardrail and the catalog poll."""
    settings, stop = state.settings, threading.Event()
    parts.callback(stop.set)
    state.models.watch(stop)
    if settings.experiments_file is not None:  # experiments may also arrive later, by the admin API
        if settings.results_token is None and not is_loopback(settings.host):
            log.warning("experiment results (GET /experiments*) are readable by anyone who reaches %s: set "
                        "DINREC_RESULTS_TOKEN to ask for a token", settings.host)
        # One worker of the replica decides; the others adopt what is recorded (serving.replica).
        lead = ReplicaLead(settings.replica_dir, "guardrail")
        parts.callback(lead.close)
        guard = state.guardrail

        def check() -> None:
            guard.check(decide=lead.holds())

        try:  # decisions other replicas already made apply from the first request
            check()
        except Exception as exc:  # noqa: BLE001 - the store may be down at start; the loop retries
            log.warning("guardrail: first check failed: %s", exc)
        every(settings.guardrail_interval_s, stop, check, name="dinrec-guardrail")
    watch_document(state.experiments_doc, state.models, state.guardrail, settings.reload_poll_s, stop)
    if settings.catalog_poll_s > 0:
        catalog.run(state.store, stop, settings.catalog_poll_s)
