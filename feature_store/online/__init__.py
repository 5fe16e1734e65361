"""Online stores: a user's recent behaviours and item popularity, read on every request.

The interface is feature_store.online.base; the backend is chosen here by its type string and
imported only when chosen (``memory``: feature_store.online.memory, ``redis`` and ``redis-cluster``:
.redis_store).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from feature_store.errors import MissingDependency, StoreConfigError
from feature_store.online.base import OnlineStore

if TYPE_CHECKING:
    from feature_store.settings import FeatureStoreSettings

__all__ = ["OnlineStore", "open_store"]
log = logging.getLogger(__name__)


def open_store(settings: FeatureStoreSettings) -> OnlineStore:
    """Build the configured store; backends are imported only when chosen."""
    if settings.store == "memory":
        from feature_store.online.memory import MemoryStore

        return MemoryStore(history_cap=settings.history_len, dedup_window_s=settings.dedup_window_s,
                           interacted_cap=settings.interacted_cap, user_ttl_s=settings.user_ttl_days * 86400,
                           seen_cap=settings.seen_cap)
    if settings.store in ("redis", "redis-cluster"):
        try:
            from feature_store.online.redis_store import RedisStore
        except ImportError as exc:  # pragma: no cover - redis is a core dependency today
            raise MissingDependency("the redis store needs `pip install redis`") from exc
        store = RedisStore(settings.redis_url, prefix=settings.redis_prefix, history_cap=settings.history_len,
                           dedup_window_s=settings.dedup_window_s, socket_timeout_s=settings.redis_timeout_ms / 1000,
                           interacted_cap=settings.interacted_cap, partitions=settings.store_partitions,
                           cluster=settings.store == "redis-cluster", user_ttl_s=settings.user_ttl_days * 86400,
                           seen_cap=settings.seen_cap)
        problem = store.eviction_problem()
        if problem and not settings.redis_allow_eviction:
            store.close()
            raise StoreConfigError(f"{problem}; or, to run on it anyway, DINREC_REDIS_ALLOW_EVICTION=true")
        if problem:
            log.error("%s (DINREC_REDIS_ALLOW_EVICTION=true: running on it)", problem)
        return store
    raise ValueError(f"unknown store type {settings.store!r}")  # pragma: no cover - Literal guards it
