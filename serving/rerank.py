"""Re-ranking after DIN: business rules applied to the scored candidates, then the top k.

Blocked items and categories are removed; items the user was recently shown are pushed down (their
score multiplied by ``shown_penalty``); then candidates are taken best first, skipping any whose
category already has ``max_per_category`` items in the list — so the cap holds in every list, and
the list is the best one under it (greedy on sorted scores is optimal for a per-category cap).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Reranker:
    max_per_category: int | None = None
    blocked_items: frozenset[str] = frozenset()
    blocked_categories: frozenset[str] = frozenset()
    shown_penalty: float = 0.5

    def select(self, candidates: Sequence[tuple[str, str, float]], k: int,
               shown: Collection[str] = ()) -> list[tuple[int, float]]:
        """``candidates``: (item_id, category_id, score) → up to ``k`` (index, adjusted score), best first."""
        scored = []
        for i, (item, category, score) in enumerate(candidates):
            if item in self.blocked_items or category in self.blocked_categories:
                continue
            scored.append((score * self.shown_penalty if item in shown else score, i))
        scored.sort(key=lambda t: -t[0])  # stable: ties keep the model's order
        chosen: list[tuple[int, float]] = []
        per_category: Counter[str] = Counter()
        for score, i in scored:
            category = candidates[i][1]
            if self.max_per_category is not None and per_category[category] >= self.max_per_category:
                continue
            per_category[category] += 1
            chosen.append((i, score))
            if len(chosen) == k:
                break
        return chosen
