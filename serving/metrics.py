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
* ``dinrec_events_over_quota_total`` — POST /events refused: a user over its events a minute (serving.quotas).
* ``dinrec_arriving_bodies``, ``dinrec_refused_bodies_total{reason}`` — request bodies being read before
  their request takes a slot, and those refused (``slow``: late, 408; ``per_client``: 429);
* ``dinrec_thread_alive{name}``, ``dinrec_thread_restarts_total{name}`` — the background threads;
* ``dinrec_store_up`` — the feature store answered its last health check (``/readyz``);
* ``dinrec_experiment_held{experiment}`` — reasons the guardrail does not act on an experiment's counts.

With several worker processes (``dinrec serve`` sets ``PROMETHEUS_MULTIPROC_DIR`` to ``metrics/`` in the
replica's folder before it starts them: serving.replica), every worker writes its counters, histograms and gauges to
files there (prometheus_client's multiprocess mode) and a scrape of any worker answers for the whole
replica: counters and histograms summed over its workers (those that exited included: what they
counted happened), ``dinrec_in_flight_requests`` summed over live workers, ``dinrec_model_info`` per
live worker (a ``pid`` label), ``dinrec_store_up`` the most recent check. ``dinrec_thread_alive`` and
``dinrec_outbox_pending_bytes`` are read from the answering worker at scrape time (each worker has its
own threads and outbox slot).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric

MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client reads it when it is imported

# Seconds: 0.5 ms .. 2.5 s.
_BUCKETS = (0.0005, 0.001, 0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.035, 0.05, 0.075, 0.1, 0.25,
            0.5, 1.0, 2.5)


class _Observed:
    """Gauges read from functions at scrape time: this process's own, nothing stored to merge."""

    def __init__(self, name: str, doc: str, label: str | None, read: Callable[[], Mapping[str, float]]) -> None:
        self.name, self.doc, self.label, self.read = name, doc, label, read

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(self.name, self.doc, labels=[self.label] if self.label else None)
        for value_label, value in self.read().items():
            family.add_metric([value_label] if self.label else [], value)
        yield family


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ServiceMetrics:
    def __init__(self) -> None:
        self.multiprocess_dir = os.environ.get(MULTIPROCESS_ENV) or None
        if self.multiprocess_dir:
            self._forget_dead_workers()
        self.registry = CollectorRegistry()  # this process's; in multiprocess mode also written to its files
        self.local = CollectorRegistry()  # read from this process at scrape time, whatever the mode
        # process_* (memory, CPU, open files: of the worker that answers the scrape) and python_info
        ProcessCollector(registry=self.local)
        PlatformCollector(registry=self.local)
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
        self.in_flight = Gauge("dinrec_in_flight_requests", "requests being served", registry=r,
                               multiprocess_mode="livesum")
        self.uploads = Gauge("dinrec_arriving_bodies", "request bodies being read, before their request is served",
                             registry=r, multiprocess_mode="livesum")
        self.upload_refusals = Counter("dinrec_refused_bodies", "request bodies refused while arriving: too slow "
                                       "(408) or too many of one client at once (429)", ["reason"], registry=r)
        self.over_quota = Counter("dinrec_events_over_quota", "POST /events requests refused (429) because a user "
                                  "of theirs was over DINREC_EVENTS_PER_USER_PER_MINUTE", registry=r)
        self.impressions_dropped = Counter("dinrec_impressions_dropped", "impressions not logged (queue full or "
                                           "sink failing)", registry=r)
        self.thread_restarts = Counter("dinrec_thread_restarts", "background threads restarted after an error",
                                       ["name"], registry=r)
        self.store_up = Gauge("dinrec_store_up", "1 when the feature store answered the last readiness check",
                              registry=r, multiprocess_mode="livemostrecent")
        self.model = Gauge("dinrec_model_info", "the model being served (value 1), its scores' precision, and the "
                           "scorer implementation and recall index timed fastest on this CPU at load",
                           ["version", "precision", "scorer", "recall_index"], registry=r,
                           multiprocess_mode="liveall")

    def serving_model(self, rec) -> None:
        """``rec``: the models.ranking.Recommender now serving."""
        self.model.clear()
        self.model.labels(version=rec.model_version, precision=rec.precision, scorer=rec.scorer.impl,
                          recall_index=rec.index.kind).set(1)

    def watch_threads(self, threads: Mapping[str, Callable[[], bool]]) -> None:
        self.local.register(_Observed(
            "dinrec_thread_alive", "background threads the answers depend on: 1 while running (this worker)",
            "name", lambda: {name: float(alive()) for name, alive in threads.items()}))

    def watch_outbox(self, pending_bytes: Callable[[], int]) -> None:
        self.local.register(_Observed(
            "dinrec_outbox_pending_bytes", "events accepted and not yet acknowledged by the stream (this worker)",
            None, lambda: {"": float(pending_bytes())}))

    def watch_guardrail(self, held: Callable[[], Mapping[str, float]]) -> None:
        """``held``: per running experiment, how many reasons the guardrail's last check found not to trust
        its counts (a bot-shaped arm, counts that do not add up): while above 0 nothing is stopped or promoted."""
        self.local.register(_Observed(
            "dinrec_experiment_held", "reasons the guardrail holds off deciding on a running experiment (0: it "
            "decides; this worker's view)", "experiment", held))

    def render(self) -> bytes:
        """The exposition: this process's metrics, or in multiprocess mode the replica's, merged."""
        if self.multiprocess_dir is None:
            return generate_latest(self.registry) + generate_latest(self.local)
        from prometheus_client.multiprocess import MultiProcessCollector

        merged = CollectorRegistry()
        MultiProcessCollector(merged, path=self.multiprocess_dir)
        return generate_latest(merged) + generate_latest(self.local)

    def _forget_dead_workers(self) -> None:
        """Drop the live-gauge files of workers that are gone (uvicorn restarts a dead worker under a new
        pid); their counters stay: what they counted happened."""
        from prometheus_client.multiprocess import mark_process_dead

        for path in glob.glob(os.path.join(self.multiprocess_dir or "", "gauge_live*_*.db")):
            pid = int(path.rsplit("_", 1)[1].removesuffix(".db"))
            if not _alive(pid):
                mark_process_dead(pid, self.multiprocess_dir)
