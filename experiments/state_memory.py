"""Experiment state beside the embedded store: its counters, and a ledger in this process."""

from __future__ import annotations

import threading

from experiments.state import ExperimentState
from feature_store.online.memory import MemoryStore


class MemoryExperimentState(ExperimentState):
    """One per service (the embedded store serves one process, so its replicas are its threads)."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self._ledger: dict[tuple[str, str], dict[str, dict]] = {}  # (table, experiment) -> key -> document
        self._lock = threading.Lock()

    def _counts(self, experiment: str) -> dict[str, dict[str, float]]:
        return self.store.experiment_counts(experiment)

    def unattributed(self) -> dict[str, int]:
        return self.store.unattributed_counts()

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
