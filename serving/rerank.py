"""Re-ranking after DIN: business rules applied to the scored candidates, then the top k.

Blocked items and categories are removed; items the user was recently shown are pushed down (their
score multiplied by ``shown_penalty``); then candidates are taken best first, skipping any whose
category already has ``max_per_category`` items in the list — so the cap holds in every list, and
the list is the best one under it (greedy on sorted scores is optimal for a per-category cap).

The long-tail lane: with ``tail_share`` > 0 and the candidates' tail flags (items outside the top
20 % by training popularity), at most ``k − round(k · tail_share)`` head items are taken while tail
candidates remain, so the best-scoring tail items DIN recalled get the rest of the slots; the list
stays ordered by score. Without enough tail candidates the slots go back to head items.
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
    tail_share: float = 0.0

    def select(self, candidates: Sequence[tuple[str, str, float]], k: int, shown: Collection[str] = (),
               tail: Sequence[bool] | None = None, tail_share: float | None = None) -> list[tuple[int, float]]:
        """``candidates``: (item_id, category_id, score) → up to ``k`` (index, adjusted score), best first.
        ``tail``: per candidate, whether it is a long-tail item (None: no lane); ``tail_share``
        overrides the reranker's (an experiment variant's)."""
        scored = []
        for i, (item, category, score) in enumerate(candidates):
            if item in self.blocked_items or category in self.blocked_categories:
                continue
            scored.append((score * self.shown_penalty if item in shown else score, i))
        scored.sort(key=lambda t: -t[0])  # stable: ties keep the model's order
        share = self.tail_share if tail_share is None else tail_share
        head_slots = k - round(k * share) if tail is not None else k
        chosen: list[tuple[int, float]] = []
        deferred: list[tuple[float, int]] = []  # head items past the head slots: used if the tail runs out
        per_category: Counter[str] = Counter()
        heads = 0

        def take(score: float, i: int) -> bool:
            category = candidates[i][1]
            if self.max_per_category is not None and per_category[category] >= self.max_per_category:
                return False
            per_category[category] += 1
            chosen.append((i, score))
            return True

        for score, i in scored:
            if tail is not None and not tail[i] and heads >= head_slots:
                deferred.append((score, i))
                continue
            if take(score, i) and (tail is None or not tail[i]):
                heads += 1
            if len(chosen) == k:
                break
        for score, i in deferred:
            if len(chosen) == k:
                break
            take(score, i)
        chosen.sort(key=lambda t: -t[1])  # stable: ties keep the order taken
        return chosen
