"""Online stores: a user's recent behaviours and item popularity, read on every request.

The interface is feature_store.online.base; the backend is chosen here by its type string and
imported only when chosen (``memory``: feature_store.online.memory, ``redis`` and ``redis-cluster``:
.redis_store).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from dinrec.feature_store.errors import StoreConfigError
from dinrec.feature_store.online.base import OnlineStore
from dinrec.storage.outage import MissingDependency

if TYPE_CHECKING:
    from dinrec.feature_store.settings import FeatureStoreSettings

__all__ = ["OnlineStore", "open_store"]
log = logging.getLogger(__name__)


def _bounds(settings: FeatureStoreSettings) -> dict:
    """What bounds the store, the same for every backend: what one user id or item id can make it hold."""
    return {"history_cap": settings.history_len, "dedup_window_s": settings.dedup_window_s,
            "interacted_cap": settings.interacted_cap, "user_ttl_s": settings.user_ttl_days * 86400,
            "seen_cap": settings.seen_cap, "popularity_window_s": settings.popularity_window_h * 3600,
            "catalog_min_users": settings.catalog_min_users, "ab_user_cap": settings.ab_user_cap,
            "attribution_window_s": settings.attribution_window_s, "ab_value_cap": settings.ab_value_cap}


def open_store(settings: FeatureStoreSettings) -> OnlineStore:
    """Build the configured store; backends are imported only when chosen."""
    if settings.store == "memory":
        from dinrec.feature_store.online.memory import MemoryStore

        return MemoryStore(**_bounds(settings))
    if settings.store in ("redis", "redis-cluster"):
        try:
            from dinrec.feature_store.online.redis_store import RedisStore
        except ImportError as exc:  # pragma: no cover - redis is a core dependency today
            raise MissingDependency("the redis store needs `pip install redis`") from exc
        store = RedisStore(settings.redis_url, prefix=settings.redis_prefix,
                           socket_timeout_s=settings.redis_timeout_ms / 1000, partitions=settings.store_partitions,
                           cluster=settings.store == "redis-cluster", **_bounds(settings))
        problem = store.eviction_problem()
        if problem and not settings.redis_allow_eviction:
            store.close()
            raise StoreConfigError(f"{problem}; or, to run on it anyway, DINREC_REDIS_ALLOW_EVICTION=true")
        if problem:
            log.error("%s (DINREC_REDIS_ALLOW_EVICTION=true: running on it)", problem)
        return store
    raise ValueError(f"unknown store type {settings.store!r}")  # pragma: no cover - Literal guards it
