"""Experiment state beside the embedded store: its counters, and a ledger in this process."""

from __future__ import annotations

import threading
from collections import Counter

from dinrec.experiments.served import Tally
from dinrec.experiments.state import ExperimentState
from dinrec.feature_store.online.memory import MemoryStore


class MemoryExperimentState(ExperimentState):
    """One per service (the embedded store serves one process, so its replicas are its threads)."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self._ledger: dict[tuple[str, str], dict[str, dict]] = {}  # (table, experiment) -> key -> document
        self._served: dict[tuple[str, str], tuple[Counter[str], set[str]]] = {}  # (experiment, variant) -> tallies
        self._lock = threading.Lock()

    def _counts(self, experiment: str) -> dict[str, dict[str, float]]:
        return self.store.experiment_counts(experiment)

    def unattributed(self) -> dict[str, int]:
        return self.store.unattributed_counts()

    def add_served(self, experiment: str, tallies: dict[str, Tally]) -> None:
        with self._lock:
            for variant, t in tallies.items():
                counts, items = self._served.setdefault((experiment, variant), (Counter(), set()))
                counts.update(t.counts)
                items.update(t.items)

    def served(self, experiment: str, variants: list[str]) -> dict[str, tuple[dict[str, float], int]]:
        with self._lock:
            held = {v: self._served.get((experiment, v)) for v in variants}
            return {v: (dict(t[0]), len(t[1])) if t else ({}, 0) for v, t in held.items()}

    def _put_first(self, table: str, experiment: str, key: str, doc: dict) -> bool:
        with self._lock:  # the first writer wins, as HSETNX in Redis
            docs = self._ledger.setdefault((table, experiment), {})
            if key in docs:
                return False
            docs[key] = dict(doc)
            return True

    def _drop(self, table: str, experiment: str, keys: list[str]) -> None:
        with self._lock:
            docs = self._ledger.get((table, experiment), {})
            for key in keys:
                docs.pop(key, None)

    def _docs(self, table: str, experiment: str) -> dict[str, dict]:
        with self._lock:
            return {k: dict(d) for k, d in self._ledger.get((table, experiment), {}).items()}
