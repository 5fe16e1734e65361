"""What each arm served, as a set: lists, degraded answers, latency, how many distinct items and how much of the
long tail — the guardrail metrics that are not per-user sums. Reported beside the per-user metrics, not held
to parity and given no interval: a list is not the unit of randomisation, a user is.

The service tallies its served lists per (experiment, variant) off the request path (serving.impressions adds
each batch's lists to a :class:`Tally` per arm) and adds the tallies to the shared experiment state (experiments.state:
``add_served``), so the figures are every replica's. Latency goes into fixed buckets, so its p95 is read the
way Prometheus' ``histogram_quantile`` reads one (linear within the bucket it falls in).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

LATENCY_BUCKETS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500)  # the last bucket is open above


@dataclass
class Tally:
    """One arm's served lists in a batch: counters by name (``lists``, ``degraded``, ``items``, ``tail_items``,
    ``lat_le_{ms}`` / ``lat_inf``) and the distinct items it showed."""

    counts: dict[str, int] = field(default_factory=dict)
    items: set[str] = field(default_factory=set)

    def add(self, items: Iterable[str], *, degraded: bool, latency_ms: float, tail_items: int) -> None:
        items = list(items)
        for name, n in (("lists", 1), ("degraded", int(degraded)), ("items", len(items)), ("tail_items", tail_items),
                        (_bucket(latency_ms), 1)):
            self.counts[name] = self.counts.get(name, 0) + n
        self.items.update(items)


def _bucket(latency_ms: float) -> str:
    return next((_bucket_name(b) for b in LATENCY_BUCKETS_MS if latency_ms <= b), "lat_inf")


def p95_ms(counts: Mapping[str, float]) -> float | None:
    """The 95th percentile latency from the bucket counts (None: nothing served; the open bucket: its floor)."""
    total = sum(counts.get(_bucket_name(b), 0) for b in LATENCY_BUCKETS_MS) + counts.get("lat_inf", 0)
    if total <= 0:
        return None
    rank, below, low = 0.95 * total, 0.0, 0.0
    for b in LATENCY_BUCKETS_MS:
        n = counts.get(_bucket_name(b), 0)
        if below + n >= rank and n > 0:
            return low + (b - low) * (rank - below) / n
        below, low = below + n, float(b)
    return float(LATENCY_BUCKETS_MS[-1])


def _bucket_name(bound: int) -> str:
    return f"lat_le_{bound}"


def summary(counts: Mapping[str, float], distinct_items: int, catalog_size: int | None) -> dict:
    """The figures the results show for one arm."""
    lists, items = counts.get("lists", 0), counts.get("items", 0)
    return {"lists": int(lists), "degraded_rate": counts.get("degraded", 0) / lists if lists else None,
            "latency_p95_ms": _round(p95_ms(counts)), "distinct_items": distinct_items,
            "coverage": distinct_items / catalog_size if catalog_size else None,
            "long_tail_share": counts.get("tail_items", 0) / items if items else None}


def _round(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, 2)
