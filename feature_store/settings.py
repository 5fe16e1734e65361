"""The online store's and ingestion's settings (env prefix ``DINREC_``), created at start-up, never at import.

They extend the stream's (:class:`dinrec.streams.settings.StreamSettings`): the processes that hold a store
(serve, ingest) read the stream too."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from dinrec.events.features import (
    DEFAULT_ATTRIBUTION_WINDOW_S,
    DEFAULT_DEDUP_WINDOW_S,
    DEFAULT_HISTORY_LEN,
    DEFAULT_INTERACTED_CAP,
)
from dinrec.streams.settings import StreamSettings


class FeatureStoreSettings(StreamSettings):
    # extra="forbid": a mistyped keyword raises; other packages' DINREC_* variables are not read as
    # fields (dinrec.cli.config reports the ones no settings class knows).
    model_config = SettingsConfigDict(env_prefix="DINREC_", extra="forbid", validate_default=True,
                                      populate_by_name=True)

    store: Literal["memory", "redis", "redis-cluster"] = Field("memory", description=(
        "the online store: memory (embedded, one process), redis (one server) or redis-cluster (Redis Cluster: "
        "DINREC_REDIS_URL names any of its nodes)"))
    redis_url: str = Field("redis://127.0.0.1:6379/0", pattern=r"^rediss?://", description=(
        "the Redis server, or a node of the Redis Cluster (redis:// or rediss:// for TLS)"))
    store_partitions: int = Field(1, ge=1, le=10_000, description=(
        "shards of the Redis store's data, one per partition of the topic (a user's keys are tagged with the "
        "partition its events go to, so a batch is one atomic script on one node): 1 keeps everything in one "
        "hash slot, whatever the topic has; otherwise the topic's partition count (ingest refuses another), "
        "the same in every process of a prefix"))
    redis_timeout_ms: int = Field(250, ge=1, le=60_000, description="per Redis call (connect, read, write)")
    redis_allow_eviction: bool = Field(False, description=(
        "open a Redis whose maxmemory-policy may evict keys (anything but noeviction): stream offsets, dedup and "
        "A/B counters can then be lost silently. Refused at start-up unless this says it is meant"))
    redis_prefix: str = Field("dinrec", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$", description=(
        "prefix of every Redis key dinrec writes (several deployments can share one Redis)"))
    history_len: int = Field(DEFAULT_HISTORY_LEN, ge=1, le=10_000,
                             description="behaviours kept per user in the online store")
    interacted_cap: int = Field(DEFAULT_INTERACTED_CAP, ge=1, le=100_000, description=(
        "items remembered per user beyond the history (the newest this many behaviours' items), which the "
        "seen-item policy keeps out of the served lists"))
    user_ttl_days: float = Field(180.0, ge=0, le=3650, description=(
        "a user's keys in the online store (history, items taken, dedup ids, A/B state) expire this long after "
        "the user's last event, so user ids clients invent cannot fill the store; 0: never (at least the "
        "dedup window otherwise)"))
    seen_cap: int = Field(10_000, ge=1, le=10_000_000, description=(
        "event ids per user the dedup set keeps within its window (the oldest go first; a person sends far "
        "fewer): bounds what one user id can make the store hold"))
    popularity_window_h: float = Field(24.0, gt=0, le=30 * 24, description=(
        "popularity counts a (user, item) once within this many hours: one client repeating a behaviour "
        "cannot lift an item into every cold-start list"))
    catalog_min_users: int = Field(3, ge=1, le=1_000_000, description=(
        "an item clients name joins the catalog (the cold lane serves it before the next retraining) and "
        "popularity once this many users took it within a popularity window, in one store shard (until then "
        "its count is kept apart and forgotten a window after its last count); 1 admits an item on its first "
        "behaviour. A trusted feed admits at once: POST /admin/catalog"))
    ab_user_cap: int = Field(1000, ge=1, le=10_000_000, description=(
        "impressions, and as many clicks, buys and carts, one user adds to an experiment's counts; beyond them "
        "the user's events are counted apart (capped), so a bot cannot outweigh an arm's people"))
    ab_value_cap: float = Field(1_000_000.0, gt=0, le=1e12, allow_inf_nan=False, description=(
        "the value of buys (an event's value) one user adds to an experiment's value per user; beyond it "
        "counted apart (capped), so one invented order cannot swing an arm"))
    dedup_window_s: float = Field(
        DEFAULT_DEDUP_WINDOW_S, ge=1, le=30 * 24 * 3600,
        description="an event id is applied once per user within this many seconds of its first application "
                    "(the store keeps one id per event for this long)")
    attribution_window_s: float = Field(DEFAULT_ATTRIBUTION_WINDOW_S, ge=1, le=30 * 24 * 3600, description=(
        "an experiment's click joins its impression if the two arrive within this many seconds of each other, "
        "in either order; what the join keeps per request expires with it"))
    ingest_batch: int = Field(
        500, ge=1, le=100_000,
        description="records per store write (one Lua script: Redis serves nothing else meanwhile, ≈ 4 ms at 500)")
    ingest_metrics_port: int | None = Field(
        None, ge=0, le=65535, description="serve /metrics (Prometheus) and /status (JSON) from `dinrec ingest`")
    ingest_metrics_host: str = Field("127.0.0.1", description="address of that endpoint (0.0.0.0 in a container)")
