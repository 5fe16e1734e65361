"""What the served list is made of — the recall lanes' sizes, the seen-item policy, the business rules and
the long-tail lane — read once, by everything that builds or measures that list (env prefix ``DINREC_``):
the service, the retrain job's gate, the training pipeline's fits and ``dinrec bench e2e``. One set of
variables, so the list the gate judges is the list users get."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from dinrec.models.rerank import Reranker


class RankingSettings(BaseSettings):
    """The served list's configuration (the service, the retrain gate, training's fits and the benches
    read these same variables)."""

    model_config = SettingsConfigDict(env_prefix="DINREC_", extra="forbid", validate_default=True)

    recall_candidates: int = Field(200, ge=1, le=10_000, description="FAISS candidates scored by DIN")
    covisit_candidates: int = Field(100, ge=0, le=10_000, description=(
        "the co-visitation lane's best unseen items added to every recall (bundles that have the lane; 0: off)"))
    popular_candidates: int = Field(0, ge=0, le=1000, description=(
        "the popularity lane: this many of the most popular unseen items join every recall (DIN ranks them)"))
    fresh_candidates: int = Field(0, ge=0, le=1000, description=(
        "the freshness lane: this many of the best new items (unknown to the model) join every recall"))
    seen_policy: Literal["all", "recent", "none"] = Field("all", description=(
        "items never recommended to a user: all they interacted with (the store keeps DINREC_INTERACTED_CAP "
        "per user beyond the history), only the recent history the model reads, or none (catalogs of "
        "repeat purchases)"))
    max_per_category: int | None = Field(None, ge=1, description="at most this many items of one category per list")
    blocked_items: frozenset[str] = Field(frozenset(), description='never recommended (JSON list: ["i1", "i2"])')
    blocked_categories: frozenset[str] = Field(frozenset(), description="no item of these categories (JSON list)")
    shown_penalty: float = Field(0.5, ge=0, le=1, description="score factor of items the request says were shown")
    tail_share: float = Field(0.1, ge=0, le=1, description=(
        "the long-tail lane: share of every prefix of each list kept for the best-scoring recalled long-tail "
        "items (events.long_tail, by training count; 0: off)"))

    def reranker(self) -> Reranker:
        return Reranker(self.max_per_category, self.blocked_items, self.blocked_categories, self.shown_penalty,
                        self.tail_share)

