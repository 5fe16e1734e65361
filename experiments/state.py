"""The experiment state every replica shares: the per-variant counters the event write keeps, and the
decision ledger (stops, ramp steps, the winner, the CTR timeline).

The counters are written by the behaviour store in the same atomic step as the events they count
(feature_store.online: one Redis script, or the embedded store's lock), so a redelivered impression
is counted once, like a behaviour; this interface only reads them. The ledger entries are
first-writer-wins records (HSETNX in Redis): of several replicas deciding at once, exactly one
decision stands and every replica reads it. Implementations: experiments.state_memory (the embedded
store) and experiments.state_redis (the Redis store's client), chosen by experiments.open_state.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

from dinrec.experiments.served import Tally
from dinrec.experiments.stats import VariantSums

RECENT_S = 86_400.0  # the last day's snapshots are kept at the guardrail's interval
HOURLY_S = 3_600.0  # older ones, one an hour


class ExperimentState(ABC):
    """Counters read from the behaviour store, and the decisions recorded once each.

    Contract (tests/feature_store/test_store_conformance.py runs it on every backend): an impression
    (with experiment, variant, request id) adds to its variant's per-user counts; a click with a
    request id is attributed to the variant that request's impression of the item was logged under,
    else counted apart — never joined silently; both once per event id."""

    @abstractmethod
    def _counts(self, experiment: str) -> dict[str, dict[str, float]]:
        """Per variant of ``experiment``, the store's sums by field name: ``field@segment`` (a user's segment,
        events.features.SEGMENTS), or a bare ``field`` for counts kept before segments were."""

    def sums(self, experiment: str) -> dict[str, VariantSums]:
        """Per variant of ``experiment``: users, and sums over them of impressions, clicks, buys, carts, value,
        their squares and products (experiments.stats.VariantSums) — counted once per event id, like the
        histories."""
        totals = {}
        for variant, row in sorted(self._counts(experiment).items()):
            merged: dict[str, float] = {}
            for field, value in row.items():
                name = field.partition("@")[0]
                merged[name] = merged.get(name, 0.0) + value
            totals[variant] = VariantSums.from_fields(merged)
        return totals

    def segments(self, experiment: str) -> dict[str, dict[str, VariantSums]]:
        """The same sums per segment of users (by their behaviours before their first exposure), per variant:
        an experiment's breakdown. Counts kept before segments were are in :meth:`sums` only."""
        split: dict[str, dict[str, dict[str, float]]] = {}
        for variant, row in sorted(self._counts(experiment).items()):
            for field, value in row.items():
                name, _, segment = field.partition("@")
                if segment:
                    split.setdefault(segment, {}).setdefault(variant, {})[name] = value
        return {seg: {v: VariantSums.from_fields(row) for v, row in rows.items()} for seg, rows in split.items()}

    @abstractmethod
    def unattributed(self) -> dict[str, int]:
        """Clicks not joined to an impression (``orphan_clicks``: the request has no logged impression of
        the item for that user, or its click was counted already), and
        experiment events of a user already counted under another variant (``variant_conflicts``)."""

    @abstractmethod
    def add_served(self, experiment: str, tallies: dict[str, Tally]) -> None:
        """Add what each variant of ``experiment`` served in a batch (experiments.served) to the shared totals."""

    @abstractmethod
    def served(self, experiment: str, variants: list[str]) -> dict[str, tuple[dict[str, float], int]]:
        """Per variant of ``variants``: the served-list counters so far, and how many distinct items it served
        (Redis: a HyperLogLog's estimate, within about 1 %)."""

    @abstractmethod
    def _put_first(self, table: str, experiment: str, key: str, doc: dict) -> bool:
        """Keep ``doc`` under ``key`` of ``table`` unless one is there; True if this call kept it."""

    @abstractmethod
    def _docs(self, table: str, experiment: str) -> dict[str, dict]:
        """Every document of ``table`` for ``experiment``, by key."""

    def stop(self, experiment: str, variant: str, decision: dict) -> bool:
        """Record that ``variant`` is stopped, unless it already is (then the first decision stands);
        True if this call recorded it. Every replica reads the same decisions."""
        return self._put_first("stopped", experiment, variant, decision)

    def stopped(self, experiment: str) -> dict[str, dict]:
        """The stopped variants of ``experiment`` and the decision that stopped each."""
        return self._docs("stopped", experiment)

    def ramp(self, experiment: str, step: int, record: dict) -> bool:
        """Record that ``experiment``'s ramp reached ``step`` (first writer wins, like ``stop``)."""
        return self._put_first("ramp", experiment, str(step), record)

    def ramp_log(self, experiment: str) -> list[dict]:
        """The ramp steps ``experiment`` has reached, in order."""
        return [d for _, d in sorted(self._docs("ramp", experiment).items(), key=lambda kv: int(kv[0]))]

    def conclude(self, experiment: str, decision: dict) -> bool:
        """Record ``experiment``'s winner (first writer wins); True if this call recorded it."""
        return self._put_first("concluded", experiment, "winner", decision)

    def conclusion(self, experiment: str) -> dict | None:
        """The winner recorded for ``experiment``, if any."""
        return self._docs("concluded", experiment).get("winner")

    def propose(self, experiment: str, decision: dict) -> bool:
        """Record the winner ``experiment`` would promote, for an operator to approve (first writer wins)."""
        return self._put_first("proposed", experiment, "winner", decision)

    def proposal(self, experiment: str) -> dict | None:
        """The winner proposed for ``experiment`` and not yet approved, if any."""
        return self._docs("proposed", experiment).get("winner")

    @abstractmethod
    def _drop(self, table: str, experiment: str, keys: list[str]) -> None:
        """Remove ``keys`` of ``table`` for ``experiment`` (those absent are ignored)."""

    def freeze(self, experiment: str, results: dict) -> bool:
        """Keep ``experiment``'s final results (when it stops), unless some are kept already: what its
        results call shows from then on, whatever becomes of the counters."""
        return self._put_first("frozen", experiment, "results", results)

    def frozen(self, experiment: str) -> dict | None:
        """The final results kept when ``experiment`` stopped, if it has."""
        return self._docs("frozen", experiment).get("results")

    def snapshot(self, experiment: str, bucket: int, snapshot: dict) -> bool:
        """Keep ``snapshot`` (the experiment's counts at time ``snapshot["t"]``) under ``bucket`` unless one
        is there already; the timeline the dashboard draws. Bounded: the snapshots of the last day at the
        guardrail's interval, one an hour before that — each snapshot also takes its hour's slot if that is
        free, and the first of each hour drops the interval snapshots older than a day (two weeks at a
        30 s interval: 2,880 + 336 kept, not 40,320)."""
        kept = self._put_first("timeline", experiment, str(bucket), snapshot)
        hour = int(snapshot["t"] // HOURLY_S)
        if kept and self._put_first("timeline_hourly", experiment, str(hour), snapshot):
            old = [k for k, d in self._docs("timeline", experiment).items()
                   if d["t"] < snapshot["t"] - RECENT_S]
            if old:
                self._drop("timeline", experiment, old)
        return kept

    def timeline(self, experiment: str) -> list[dict]:
        """The snapshots of ``experiment``, oldest first: hourly ones before the last day's."""
        recent = sorted(self._docs("timeline", experiment).values(), key=lambda d: d["t"])
        start = recent[0]["t"] if recent else math.inf
        hourly = sorted((d for d in self._docs("timeline_hourly", experiment).values() if d["t"] < start),
                        key=lambda d: d["t"])
        return hourly + recent
