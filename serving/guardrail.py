"""The guardrail: a variant whose CTR is significantly worse than control is stopped by itself.
(Each check also records a snapshot of the counts: the dashboard's CTR-over-time.)

Every ``interval_s`` each replica analyses its running experiments from the store's counters. A
treatment is stopped when the always-valid confidence sequence for its CTR lift lies wholly below
zero (``feature_store.experiments.stats``: looking every interval does not inflate false alarms,
which a fixed-horizon test would) and both arms have at least ``min_users``. The decision is
written to the store once (the first replica's stands: HSETNX in Redis), so every replica reads the
same list; its users then leave the experiment — they get the default experience (no variant
overrides) and their lists are logged outside it, so the stopped arm's numbers freeze and control's
stay clean.
"""

from __future__ import annotations

import logging
import threading
import time

from feature_store.experiments.stats import VariantSums, compare
from feature_store.online import OnlineStore
from serving.experiments import Experiments

log = logging.getLogger(__name__)


class Guardrail:
    def __init__(self, store: OnlineStore, experiments: Experiments, *, alpha: float = 0.05, min_users: int = 100,
                 interval_s: float = 30.0) -> None:
        self.store, self.experiments = store, experiments
        self.alpha, self.min_users, self.interval_s = alpha, min_users, interval_s
        self._stopped: dict[str, frozenset[str]] = {}  # read by requests: replaced whole, never mutated

    def stopped(self, experiment: str) -> frozenset[str]:
        return self._stopped.get(experiment, frozenset())

    def check(self) -> list[dict]:
        """Analyse every running experiment once; stop what is significantly worse. Returns the
        decisions this call recorded (a replica that finds one already recorded adopts it)."""
        made = []
        for exp in self.experiments.all:
            if exp.status != "running":
                continue
            sums = self.store.ab_sums(exp.name)
            now = time.time()
            self.store.ab_snapshot(exp.name, int(now // self.interval_s), {  # one per interval, whoever is first
                "t": now, "variants": {v: {"users": s.users, "impressions": s.impressions, "clicks": s.clicks}
                                       for v, s in sums.items()}})
            control = sums.get(exp.control_name, VariantSums(0, 0, 0, 0, 0, 0))
            for variant in exp.variants:
                treated = sums.get(variant.name)
                if variant.name == exp.control_name or treated is None:
                    continue
                if min(control.users, treated.users) < self.min_users:
                    continue
                r = compare(control, treated, variant.name, alpha=self.alpha)
                if r.sequential != "worse":
                    continue
                decision = {"experiment": exp.name, "variant": variant.name, "at": time.time(), "reason": "guardrail",
                            "lift": r.lift, "cs_low": r.cs_low, "cs_high": r.cs_high,
                            "users": {"control": control.users, "variant": treated.users}}
                if self.store.ab_stop(exp.name, variant.name, decision):
                    log.warning("guardrail stopped %s/%s: CTR lift %+.1f%% (always-valid CI %+.1f%% .. %+.1f%%)",
                                exp.name, variant.name, 100 * r.lift, 100 * r.cs_low, 100 * r.cs_high)
                    made.append(decision)
            self._stopped = {**self._stopped, exp.name: frozenset(self.store.ab_stopped(exp.name))}
        return made

    def run(self, stop: threading.Event) -> threading.Thread:
        def loop() -> None:
            while not stop.wait(self.interval_s):
                try:
                    self.check()
                except Exception as exc:  # noqa: BLE001 - a store outage must not end the guardrail
                    log.warning("guardrail check failed; will retry: %s", exc)

        thread = threading.Thread(target=loop, name="dinrec-guardrail", daemon=True)
        thread.start()
        return thread
