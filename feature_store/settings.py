"""feature_store settings (env prefix ``DINREC_``), created at start-up, never at import."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from feature_store.features import DEFAULT_HISTORY_LEN


class FeatureStoreSettings(BaseSettings):
    # extra="ignore": other packages' DINREC_* variables share this environment.
    model_config = SettingsConfigDict(env_prefix="DINREC_", extra="ignore", validate_default=True)

    store: Literal["memory", "redis"] = "memory"
    redis_url: str = Field("redis://127.0.0.1:6379/0", pattern=r"^rediss?://")
    redis_prefix: str = Field("dinrec", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")
    history_len: int = Field(DEFAULT_HISTORY_LEN, ge=1, le=10_000,
                             description="behaviours kept per user in the online store")
    stream: Literal["inprocess", "kafka"] = "inprocess"
    kafka_bootstrap: str = Field("127.0.0.1:9092", min_length=3)
    topic: str = Field("dinrec.events", pattern=r"^[A-Za-z0-9._-]{1,249}$")
    consumer_group: str = Field("dinrec-ingest", min_length=1)
    dead_letter_path: str | None = Field(None, description="JSONL file for events that fail validation")
