"""The store's reads as serving makes them: live popularity reused for a moment, never stale past it."""

from __future__ import annotations

from dinrec.events.schema import BehaviourEvent
from dinrec.feature_store.online.memory import MemoryStore
from dinrec.serving.degraded import GuardedStore


class CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__(history_cap=5, catalog_min_users=1)  # every item in popularity from its first user
        self.popular_reads = 0

    def popular(self, k: int) -> list[tuple[str, float]]:
        self.popular_reads += 1
        return super().popular(k)


def behaviour(n: int, item: str) -> BehaviourEvent:
    return BehaviourEvent(event_id=f"e{n}", user_id=f"u{n}", item_id=item, ts=float(n))


def test_live_popularity_is_reused_within_its_cache_time_and_read_again_after():
    store, now = CountingStore(), [100.0]
    store.write([behaviour(n, item) for n, item in enumerate("aaabbc")])
    guarded = GuardedStore(store, popular_cache_s=1.0, clock=lambda: now[0])
    assert guarded.popular(2) == [("a", 3.0), ("b", 2.0)] and store.popular_reads == 1
    assert guarded.popular(1) == [("a", 3.0)] and store.popular_reads == 1  # a prefix of the list read
    assert guarded.popular(3) == [("a", 3.0), ("b", 2.0), ("c", 1.0)] and store.popular_reads == 2  # longer
    assert guarded.popular(10) == [("a", 3.0), ("b", 2.0), ("c", 1.0)] and store.popular_reads == 3
    assert guarded.popular(10) == [("a", 3.0), ("b", 2.0), ("c", 1.0)] and store.popular_reads == 3  # all there is
    store.write([behaviour(n, "c") for n in range(6, 10)])
    assert guarded.popular(1) == [("a", 3.0)] and store.popular_reads == 3  # within the second: as read
    now[0] += 1.0
    assert guarded.popular(1) == [("c", 5.0)] and store.popular_reads == 4


def test_no_cache_time_reads_on_every_call():
    store = CountingStore()
    store.write([behaviour(0, "a")])
    guarded = GuardedStore(store)
    for _ in range(3):
        assert guarded.popular(1) == [("a", 1.0)]
    assert store.popular_reads == 3
