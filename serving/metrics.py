"""The service's Prometheus metrics, one registry per app (tests build many apps in one process).

* ``dinrec_http_request_seconds{route,status}`` — whole requests, by route template;
* ``dinrec_stage_seconds{stage}`` — features (the store read), recall (FAISS), rank (DIN + rules);
* ``dinrec_recommend_cpu_seconds_total{stage}`` — the worker thread's CPU spent in /recommend's stages:
  assign, features, recall, score, select, log, encode (``dinrec bench serve`` sets them beside the
  processes' whole CPU: the rest is HTTP, middleware, the framework and background threads);
* ``dinrec_degraded_responses_total{reason}`` — answers given without a dependency;
* ``dinrec_in_flight_requests``, ``dinrec_model_info{version,precision,scorer,recall_index}``,
  ``dinrec_outbox_pending_bytes`` (events accepted, not yet in the stream);
* ``dinrec_shed_requests_total`` — refused for load (DINREC_MAX_IN_FLIGHT);
* ``dinrec_thread_alive{name}``, ``dinrec_thread_restarts_total{name}`` — the background threads;
* ``dinrec_store_up`` — the feature store answered its last health check (``/readyz``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Seconds: 0.5 ms .. 2.5 s.
_BUCKETS = (0.0005, 0.001, 0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.035, 0.05, 0.075, 0.1, 0.25,
            0.5, 1.0, 2.5)


class ServiceMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Histogram("dinrec_http_request_seconds", "HTTP requests by route template and status",
                                  ["route", "status"], buckets=_BUCKETS, registry=r)
        self.stages = Histogram("dinrec_stage_seconds", "time per stage of a recommendation: features, recall, rank",
                                ["stage"], buckets=_BUCKETS, registry=r)
        self.recommend_cpu = Counter("dinrec_recommend_cpu_seconds", "CPU of the worker thread spent in /recommend's "
                                     "stages", ["stage"], registry=r)
        self.degraded = Counter("dinrec_degraded_responses", "answers given without a dependency", ["reason"],
                                registry=r)
        self.shed = Counter("dinrec_shed_requests", "requests refused with 503 because too many were in progress",
                            registry=r)
        self.in_flight = Gauge("dinrec_in_flight_requests", "requests being served", registry=r)
        self.impressions_dropped = Counter("dinrec_impressions_dropped", "impressions not logged (queue full or "
                                           "sink failing)", registry=r)
        self.thread_restarts = Counter("dinrec_thread_restarts", "background threads restarted after an error",
                                       ["name"], registry=r)
        self.store_up = Gauge("dinrec_store_up", "1 when the feature store answered the last readiness check",
                              registry=r)
        self.model = Gauge("dinrec_model_info", "the model being served (value 1), its scores' precision, and the "
                           "scorer implementation and recall index timed fastest on this CPU at load",
                           ["version", "precision", "scorer", "recall_index"], registry=r)

    def serving_model(self, rec) -> None:
        """``rec``: the serving.ranking.Recommender now serving."""
        self.model.clear()
        self.model.labels(version=rec.model_version, precision=rec.precision, scorer=rec.scorer.impl,
                          recall_index=rec.index.kind).set(1)

    def watch_threads(self, threads: Mapping[str, Callable[[], bool]]) -> None:
        gauge = Gauge("dinrec_thread_alive", "background threads the answers depend on: 1 while running",
                      ["name"], registry=self.registry)
        for name, alive in threads.items():
            gauge.labels(name).set_function(lambda alive=alive: float(alive()))

    def watch_outbox(self, pending_bytes: Callable[[], int]) -> None:
        Gauge("dinrec_outbox_pending_bytes", "events accepted and not yet acknowledged by the stream",
              registry=self.registry).set_function(pending_bytes)
