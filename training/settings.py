"""Training settings (env prefix ``DINREC_TRAIN_``; CLI flags override), validated at start-up."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class TrainSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DINREC_TRAIN_", extra="ignore", validate_default=True)

    epochs: int = Field(2, ge=1, le=1000)
    batch_size: int = Field(1024, ge=1, le=1 << 20)
    lr: float = Field(1e-3, gt=0, le=1.0)
    seq_len: int = Field(50, ge=1, le=10_000, description="behaviours per history (L)")
    negatives: int = Field(1, ge=1, le=100, description="sampled negatives per positive")
    item_dim: int = Field(16, ge=1, le=4096)
    cat_dim: int = Field(16, ge=1, le=4096)
    mlp_hidden: tuple[int, ...] = (200, 80)
    attention_hidden: tuple[int, ...] = (80, 40)
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: int = Field(0, ge=0, description="torch CPU threads; 0 = all cores")
    eval_batch_size: int = Field(8192, ge=1)
    progress: bool = True
