"""Experiment state on the Redis store's client: the counters its write script keeps (key layout in
feature_store.online.redis_store), and the ledger in hashes written with HSETNX."""

from __future__ import annotations

import json

from redis.exceptions import RedisError

from experiments.state import ExperimentState
from experiments.stats import VariantSums
from feature_store.errors import StoreUnavailable
from feature_store.online.redis_store import RedisStore


class RedisExperimentState(ExperimentState):
    """Every replica reads and writes the same keys: ``{prefix}:ab:{experiment}:{table}`` hashes."""

    def __init__(self, store: RedisStore) -> None:
        self.store, self._r = store, store.client

    def _unavailable(self, what: str, exc: RedisError) -> StoreUnavailable:
        return StoreUnavailable(f"redis {what} failed ({self.store.url}): {exc}")

    def sums(self, experiment: str) -> dict[str, VariantSums]:
        base = self.store.experiment_key(experiment)
        try:
            variants = sorted(self._r.smembers(f"{base}:variants"))
            pipe = self._r.pipeline(transaction=False)
            for v in variants:
                pipe.hgetall(f"{base}:v:{v}")
            rows = pipe.execute()
        except RedisError as exc:
            raise self._unavailable("read", exc) from exc
        return {v: VariantSums(int(r.get("users", 0)),
                               *(float(r.get(f, 0)) for f in ("n", "c", "n2", "c2", "nc", "tail_c")))
                for v, r in zip(variants, rows, strict=True)}

    def unattributed(self) -> dict[str, int]:
        try:
            raw = self._r.hgetall(f"{self.store.prefix}:ab:unattributed")
        except RedisError as exc:
            raise self._unavailable("read", exc) from exc
        return {k: int(raw.get(k, 0)) for k in ("orphan_clicks", "variant_conflicts")}

    def _put_first(self, table: str, experiment: str, key: str, doc: dict) -> bool:
        try:  # HSETNX: of several replicas writing at once, exactly one records it
            return bool(self._r.hsetnx(f"{self.store.experiment_key(experiment)}:{table}", key, json.dumps(doc)))
        except RedisError as exc:
            raise self._unavailable("write", exc) from exc

    def _docs(self, table: str, experiment: str) -> dict[str, dict]:
        try:
            raw = self._r.hgetall(f"{self.store.experiment_key(experiment)}:{table}")
        except RedisError as exc:
            raise self._unavailable("read", exc) from exc
        return {f: json.loads(d) for f, d in raw.items()}
