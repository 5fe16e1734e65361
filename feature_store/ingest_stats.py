"""What ingestion counts, in one object: read by `dinrec ingest status --json` and exported as
Prometheus metrics. The latency histograms are prometheus_client's (as serving's are); the counters
and the lag are exported by a collector over this object, so there is one source of truth."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Histogram, PlatformCollector, ProcessCollector

# Seconds: 0.5 ms .. 60 s, roughly x2.5 apart.
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def bucket_quantile(histogram: Histogram, q: float) -> float | None:
    """Upper bound of the bucket holding the ``q``-quantile (None before any observation)."""
    buckets = [(float(s.labels["le"]), s.value) for m in histogram.collect() for s in m.samples
               if s.name.endswith("_bucket")]
    total = buckets[-1][1] if buckets else 0
    if total == 0:
        return None
    return next(bound for bound, cumulative in buckets if cumulative >= q * total)


@dataclass
class IngestStats:
    consumed: int = 0        # records taken from the stream and settled (applied or dead-lettered)
    applied: int = 0         # behaviours applied for the first time (the store's count)
    dead_lettered: int = 0   # records that failed validation, sent to the dead-letter topic
    skipped: int = 0         # records the store already held (redelivered after a crash or rebalance)
    rewinds: int = 0         # partitions re-read from the store's offsets (the store lost writes, or a
    #                          new owner got ahead)
    retries: int = 0         # failed store / stream calls, retried with backoff
    batches: int = 0
    lag: dict[int, int] = field(default_factory=dict)       # records behind, per assigned partition
    started: float = field(default_factory=time.time)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    registry: CollectorRegistry = field(default_factory=CollectorRegistry, repr=False)  # what /metrics serves
    apply_s: Histogram = field(init=False, repr=False)  # store write per batch
    age_s: Histogram = field(init=False, repr=False)    # produced -> applied, per record

    def __post_init__(self) -> None:
        self.apply_s = Histogram("dinrec_ingest_apply_seconds", "store write time per batch", buckets=BUCKETS,
                                 registry=self.registry)
        self.age_s = Histogram("dinrec_ingest_event_age_seconds", "time from produce to applied, per record",
                               buckets=BUCKETS, registry=self.registry)
        self.registry.register(_Counters(self))
        ProcessCollector(registry=self.registry)  # process_* : memory, CPU, open files
        PlatformCollector(registry=self.registry)

    def snapshot(self) -> dict:
        with self.lock:
            up = max(time.time() - self.started, 1e-9)
            return {
                "consumed": self.consumed, "applied": self.applied, "dead_lettered": self.dead_lettered,
                "skipped": self.skipped, "rewinds": self.rewinds, "retries": self.retries, "batches": self.batches,
                "events_per_s": round(self.consumed / up, 1), "uptime_s": round(up, 1),
                "apply_p50_ms": _ms(bucket_quantile(self.apply_s, 0.5)),
                "apply_p99_ms": _ms(bucket_quantile(self.apply_s, 0.99)),
                "age_p50_ms": _ms(bucket_quantile(self.age_s, 0.5)),
                "age_p99_ms": _ms(bucket_quantile(self.age_s, 0.99)),
                "lag": {str(p): n for p, n in sorted(self.lag.items())},
            }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


class _Counters:
    """The counters and the lag of an IngestStats, as prometheus_client collects them."""

    def __init__(self, stats: IngestStats) -> None:
        self._s = stats

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        s = self._s
        with s.lock:
            for name, value, doc in [
                ("consumed", s.consumed, "records taken from the stream and settled"),
                ("applied", s.applied, "behaviours applied to the store for the first time"),
                ("dead_lettered", s.dead_lettered, "records sent to the dead-letter topic"),
                ("skipped", s.skipped, "redelivered records the store already held"),
                ("rewinds", s.rewinds, "partitions re-read from the store's offsets"),
                ("retries", s.retries, "failed store or stream calls retried with backoff"),
            ]:
                yield CounterMetricFamily(f"dinrec_ingest_{name}", doc, value=value)
            lag = GaugeMetricFamily("dinrec_ingest_lag_records", "records behind the partition's end",
                                    labels=["partition"])
            for p, n in sorted(s.lag.items()):
                lag.add_metric([str(p)], n)
            yield lag
