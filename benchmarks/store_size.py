"""`dinrec bench store-size`: what the online store costs in Redis memory, per user and per item, and the
cluster that follows for a given number of users and items.

``users`` synthetic users each get ``behaviours`` behaviours over ``items`` items (Zipf-like), written
through the store's own script in batches as ingestion writes them, into a fresh key prefix; then
``MEMORY USAGE`` (every sample) of every key the store wrote is summed by key family: the per-user
families (history, dedup set, interacted items) divided by the users, the per-item ones (popularity,
catalog) by the items. The dedup set holds one entry per event applied within ``DINREC_DEDUP_WINDOW_S``
(a day): here every behaviour is within it, the upper bound for a user that active. A/B counters
(per user in an experiment: one small hash) and the attribution hashes (per served list, until its
window ends) are measured the same way when ``impressions`` > 0.

``MEMORY USAGE`` counts a key's name, value and dictionary entry; Redis' ``used_memory`` also grew by
the expiry entries, the allocator's rounding and its own structures. The projection takes the larger
of the two views per user (the growth not explained by the item keys, divided by the users), multiplies
by the users and items asked for, and divides by what one node may hold (``node_gb`` × ``fill``:
headroom for a snapshot's copy-on-write fork and for growth); a Redis Cluster needs that many
primaries, each with its replica.
"""

from __future__ import annotations

import math
import os
import time

import numpy as np

from dinrec.events.schema import BehaviourEvent
from dinrec.feature_store.online.redis_store import RedisStore
from dinrec.training.progress import Stages, showing

USER_FAMILIES = ("hist", "seen", "items")
ITEM_FAMILIES = ("pop", "catalog", "catalog:order")


def _family(key: str, prefix: str) -> str:
    rest = key[len(prefix) + 1:]
    if rest.startswith("{"):
        rest = rest.split(":", 1)[1]  # the shard's hash tag
    for family in ("hist", "seen", "items", "att", "catalog:order", "catalog", "pop", "offsets", "ab", "layout"):
        if rest.startswith(family):
            return family
    return "other"


def measure(redis_url: str, *, users: int = 5000, behaviours: int = 50, items: int = 20_000, batch: int = 500,
            impressions: int = 10, partitions: int = 1, seed: int = 0, progress: bool | None = None) -> dict:
    """``progress``: a line per stage on stderr (default: when stderr is a terminal)."""
    say = Stages(showing(progress))
    rng = np.random.default_rng(seed)
    prefix = f"bench-size-{os.getpid()}-{time.monotonic_ns()}"
    store = RedisStore(redis_url, prefix=prefix, history_cap=behaviours, partitions=partitions)
    client = store.client
    before = int(client.info("memory")["used_memory"])
    ranks = np.minimum(rng.zipf(1.3, users * behaviours), items) - 1  # popular items first, a long tail
    events: list[BehaviourEvent] = []
    now = time.time()
    try:
        for u in range(users):
            for j in range(behaviours):
                item = int(ranks[u * behaviours + j])
                events.append(BehaviourEvent(event_id=f"e{u}-{j}", user_id=f"user-{u:08d}", item_id=f"item-{item:08d}",
                                             category_id=f"cat-{item % 500:04d}", ts=now - 3600 + j))
            for j in range(impressions):  # one served list per user, in an experiment
                events.append(BehaviourEvent(event_id=f"imp-{u}-{j}", user_id=f"user-{u:08d}", event_type="impression",
                                             item_id=f"item-{j:08d}", ts=now, request_id=f"req-{u}",
                                             experiment="exp", variant="A" if u % 2 else "B", position=j))
            if len(events) >= batch:
                store.write(events)
                events = []
        store.write(events)
        say(f"{users} users written ({users * behaviours} behaviours)")
        keys = list(client.scan_iter(f"{prefix}:*", count=5000))
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.memory_usage(key, samples=0)
        sizes = pipe.execute()
        after = int(client.info("memory")["used_memory"])
        version = client.info("server")["redis_version"]
        say(f"memory usage of {len(keys)} keys read")
    finally:
        store.flush_prefix()
        store.close()
    by_family: dict[str, list[int]] = {}
    for key, size in zip(keys, sizes, strict=True):
        by_family.setdefault(_family(key, prefix), []).append(int(size or 0))
    per_user = {f: round(sum(by_family.get(f, [])) / users, 1) for f in USER_FAMILIES}
    per_user["ab_and_attribution"] = round((sum(by_family.get("ab", [])) + sum(by_family.get("att", []))) / users, 1)
    distinct_items = len({int(r) for r in ranks})
    per_item = {f: round(sum(by_family.get(f, [])) / distinct_items, 1) for f in ITEM_FAMILIES}
    item_bytes = sum(sum(by_family.get(f, [])) for f in ITEM_FAMILIES)
    growth_per_user = (after - before - item_bytes) / users
    return {
        "users": users, "behaviours_per_user": behaviours, "items": distinct_items, "impressions_per_user": impressions,
        "partitions": partitions, "keys": len(keys), "redis_version": version,
        "memory_usage_per_user": per_user, "memory_usage_per_user_total": round(sum(per_user.values()), 1),
        "used_memory_growth_per_user": round(growth_per_user, 1),
        "bytes_per_user": round(max(sum(per_user.values()), growth_per_user), 1),
        "memory_usage_per_item": per_item, "bytes_per_item": round(item_bytes / distinct_items, 1),
    }


def project(measured: dict, *, users: list[int], items: int, node_gb: float = 26.0, fill: float = 0.6) -> list[dict]:
    """Memory for ``users`` (each) and ``items``, and the primaries a cluster of ``node_gb`` nodes needs."""
    out = []
    usable = node_gb * 1e9 * fill
    for n in users:
        need = n * measured["bytes_per_user"] + items * measured["bytes_per_item"]
        out.append({"users": n, "items": items, "gb": round(need / 1e9, 1),
                    "primaries": max(1, math.ceil(need / usable)), "node_gb": node_gb, "fill": fill})
    return out
