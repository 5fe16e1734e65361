"""The served-list figures per arm: the tally of a batch, the p95 read from latency buckets as Prometheus'
histogram_quantile reads one, and the summary the results show."""

from __future__ import annotations

import numpy as np
import pytest

from dinrec.experiments.served import LATENCY_BUCKETS_MS, Tally, p95_ms, summary


def test_a_tally_counts_lists_degraded_answers_items_and_the_tail():
    t = Tally()
    t.add(["a", "b", "c"], degraded=False, latency_ms=7.0, tail_items=1)
    t.add(["b", "d"], degraded=True, latency_ms=400.0, tail_items=2)
    t.add(["a"], degraded=False, latency_ms=1e6, tail_items=0)  # beyond every bucket
    assert t.counts == {"lists": 3, "degraded": 1, "items": 6, "tail_items": 3, "lat_le_10": 1, "lat_le_500": 1,
                        "lat_inf": 1}
    assert t.items == {"a", "b", "c", "d"}
    s = summary(t.counts, len(t.items), catalog_size=8)
    assert s == {"lists": 3, "degraded_rate": pytest.approx(1 / 3), "latency_p95_ms": 2500.0, "distinct_items": 4,
                 "coverage": 0.5, "long_tail_share": 0.5}
    assert summary({}, 0, None) == {"lists": 0, "degraded_rate": None, "latency_p95_ms": None, "distinct_items": 0,
                                    "coverage": None, "long_tail_share": None}


def test_the_p95_from_buckets_is_within_its_bucket_of_the_true_one():
    rng = np.random.default_rng(3)
    latencies = rng.lognormal(np.log(30), 0.6, 20_000)
    t = Tally()
    for x in latencies:
        t.add([], degraded=False, latency_ms=float(x), tail_items=0)
    true = float(np.quantile(latencies, 0.95))
    estimate = p95_ms(t.counts)
    assert estimate is not None
    low = max((b for b in (0, *LATENCY_BUCKETS_MS) if b < true), default=0)
    high = min(b for b in LATENCY_BUCKETS_MS if b >= true)
    assert low <= estimate <= high and estimate == pytest.approx(true, rel=0.15)
