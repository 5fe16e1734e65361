"""A/B experiments: definitions and assignment (spec, running), statistics (stats), the guardrail
policy (guardrail) and the state every replica shares (state: counters and the decision ledger)."""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dinrec.experiments.state import ExperimentState
    from dinrec.feature_store.online import OnlineStore

_states: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def open_state(store: OnlineStore) -> ExperimentState:
    """The experiment state kept beside ``store`` (its counters are written with its events): one
    per store, so everything sharing a store — the embedded one included — reads the same decisions.
    The backend is imported only when chosen."""
    with _lock:
        state = _states.get(store)
        if state is None:
            state = _states[store] = _build(store)
        return state


def _build(store: OnlineStore) -> ExperimentState:
    backend = store.backend
    if backend == "memory":
        from dinrec.experiments.state_memory import MemoryExperimentState
        from dinrec.feature_store.online.memory import MemoryStore

        if isinstance(store, MemoryStore):
            return MemoryExperimentState(store)
    if backend in ("redis", "redis-cluster"):
        from dinrec.experiments.state_redis import RedisExperimentState
        from dinrec.feature_store.online.redis_store import RedisStore

        if isinstance(store, RedisStore):
            return RedisExperimentState(store)
    raise ValueError(f"no experiment state for a {type(store).__name__} (backend {backend!r})")
