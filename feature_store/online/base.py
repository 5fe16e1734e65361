"""The online-store interface and the factory that picks a backend by its type string."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING

from feature_store.errors import MissingDependency
from feature_store.features import HistoryItem, is_behaviour
from feature_store.schema import BehaviourEvent

if TYPE_CHECKING:
    from feature_store.settings import FeatureStoreSettings


class OnlineStore(ABC):
    """Per-user capped behaviour histories plus item popularity.

    Contract (tests/feature_store/test_store_conformance.py runs it on every backend):
    * ``write`` keeps only behaviours (impressions are not history), is idempotent per
      event_id, and orders by (ts, event_id) whatever the arrival order; popularity counts
      each event once.
    * ``history`` returns the newest ``limit`` behaviours, oldest first.
    """

    def __init__(self, history_cap: int) -> None:
        if history_cap < 1:
            raise ValueError("history_cap must be >= 1")
        self.history_cap = history_cap

    def write(self, events: Sequence[BehaviourEvent]) -> int:
        """Store the behaviours among ``events``; return how many were new."""
        items = [(e.user_id, HistoryItem(e.ts, e.event_id, e.item_id, e.category_id))
                 for e in events if is_behaviour(e.event_type, e.value)]
        return self._write(items) if items else 0

    @abstractmethod
    def _write(self, items: list[tuple[str, HistoryItem]]) -> int: ...

    @abstractmethod
    def histories(self, user_ids: Sequence[str], limit: int) -> dict[str, list[HistoryItem]]:
        """Newest ``limit`` behaviours per user (oldest first); one round trip for all users."""

    def history(self, user_id: str, limit: int) -> list[HistoryItem]:
        return self.histories([user_id], limit)[user_id]

    @abstractmethod
    def popular(self, k: int) -> list[tuple[str, float]]:
        """The ``k`` items with the most behaviours, most popular first."""

    @abstractmethod
    def ping(self) -> None:
        """Raise StoreUnavailable if the store cannot serve."""

    def close(self) -> None:  # noqa: B027 - optional hook
        pass


def open_store(settings: FeatureStoreSettings) -> OnlineStore:
    """Build the configured store; backends are imported only when chosen."""
    if settings.store == "memory":
        from feature_store.online.memory import MemoryStore

        return MemoryStore(history_cap=settings.history_len)
    if settings.store == "redis":
        try:
            from feature_store.online.redis_store import RedisStore
        except ImportError as exc:  # pragma: no cover - redis is a core dependency today
            raise MissingDependency("the redis store needs `pip install redis`") from exc
        return RedisStore(settings.redis_url, prefix=settings.redis_prefix, history_cap=settings.history_len)
    raise ValueError(f"unknown store type {settings.store!r}")  # pragma: no cover - Literal guards it
