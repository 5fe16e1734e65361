"""Experiment state on the Redis store: the counters its write script keeps per shard (key layout in
feature_store.online.redis_store, summed by the store), and the ledger in hashes written with HSETNX."""

from __future__ import annotations

import json

from dinrec.experiments.served import Tally
from dinrec.experiments.state import ExperimentState
from dinrec.feature_store.errors import StoreUnavailable
from dinrec.feature_store.online.redis_store import REDIS_ERRORS, RedisStore


class RedisExperimentState(ExperimentState):
    """Every replica reads and writes the same keys: ``{prefix}:ab:{experiment}:{table}`` hashes (single
    keys, so in a cluster each is one node's)."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store

    @property
    def _r(self):  # the store's client, connected on first use (a replica may start while Redis is down)
        return self.store.client

    def _unavailable(self, what: str, exc: Exception) -> StoreUnavailable:
        return StoreUnavailable(f"redis {what} failed ({self.store.url}): {exc}")

    def _counts(self, experiment: str) -> dict[str, dict[str, float]]:
        return self.store.experiment_sums(experiment)  # summed over the store's shards

    def unattributed(self) -> dict[str, int]:
        return self.store.unattributed_counts()

    def add_served(self, experiment: str, tallies: dict[str, Tally]) -> None:
        base = self.store.experiment_key(experiment)
        try:  # single keys per experiment and variant (one node each in a cluster), one round trip
            pipe = self._r.pipeline(transaction=False)
            for variant, t in tallies.items():
                for name, n in t.counts.items():
                    pipe.hincrby(f"{base}:served:{variant}", name, n)
                if t.items:
                    pipe.pfadd(f"{base}:served_items:{variant}", *t.items)
            pipe.execute()
        except REDIS_ERRORS as exc:
            raise self._unavailable("write", exc) from exc

    def served(self, experiment: str, variants: list[str]) -> dict[str, tuple[dict[str, float], int]]:
        base = self.store.experiment_key(experiment)
        try:
            pipe = self._r.pipeline(transaction=False)
            for v in variants:
                pipe.hgetall(f"{base}:served:{v}")
            rows = pipe.execute()
            # One key each, outside the pipeline: redis-py's cluster pipeline refuses PFCOUNT.
            distinct = [int(self._r.pfcount(f"{base}:served_items:{v}")) for v in variants]
        except REDIS_ERRORS as exc:
            raise self._unavailable("read", exc) from exc
        return {v: ({f: float(x) for f, x in row.items()}, n) for v, row, n in zip(variants, rows, distinct,
                                                                                      strict=True)}

    def _put_first(self, table: str, experiment: str, key: str, doc: dict) -> bool:
        try:  # HSETNX: of several replicas writing at once, exactly one records it
            return bool(self._r.hsetnx(f"{self.store.experiment_key(experiment)}:{table}", key, json.dumps(doc)))
        except REDIS_ERRORS as exc:
            raise self._unavailable("write", exc) from exc

    def _drop(self, table: str, experiment: str, keys: list[str]) -> None:
        try:
            self._r.hdel(f"{self.store.experiment_key(experiment)}:{table}", *keys)
        except REDIS_ERRORS as exc:
            raise self._unavailable("write", exc) from exc

    def _docs(self, table: str, experiment: str) -> dict[str, dict]:
        try:
            raw = self._r.hgetall(f"{self.store.experiment_key(experiment)}:{table}")
        except REDIS_ERRORS as exc:
            raise self._unavailable("read", exc) from exc
        return {f: json.loads(d) for f, d in raw.items()}
