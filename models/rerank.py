"""Re-ranking after DIN: business rules applied to the scored candidates, then the top k.

Blocked items and categories are removed; items the user was recently shown are pushed down (their
score multiplied by ``shown_penalty``); then candidates are taken best first, skipping any whose
category already has ``max_per_category`` items in the list — so the cap holds in every list, and
the list is the best one under it (greedy on sorted scores is optimal for a per-category cap).

The long-tail lane: with ``tail_share`` > 0 and the candidates' tail flags (events.long_tail,
by training counts), every prefix of the list — its first n items, for every n — holds at least
``floor(n · tail_share)`` tail items while tail candidates remain: each position takes the best
candidate left unless the share needs a tail item there, then the best tail item left. So a list of
``k`` is the first ``k`` of a longer one (a page, a bench reading the top 10 of 50), and the tail
slots sit where the share falls due, not all at the bottom. Without enough tail candidates the
slots go back to head items.
"""

from __future__ import annotations

import math
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
               tail: Sequence[bool] | None = None, tail_share: float | None = None,
               listed: Collection[str] = ()) -> list[tuple[int, float]]:
        """``candidates``: (item_id, category_id, score) → up to ``k`` (index, adjusted score) in list
        order: best first, but for the tail slots the lane fills where its share falls due.
        ``tail``: per candidate, whether it is a long-tail item (None: no lane); ``tail_share``
        overrides the reranker's (an experiment variant's). ``listed``: the categories of items already
        in the list these continue (a fill after the model's items), which count against the cap."""
        scored = []
        for i, (item, category, score) in enumerate(candidates):
            if item in self.blocked_items or category in self.blocked_categories:
                continue
            scored.append((score * self.shown_penalty if item in shown else score, i))
        scored.sort(key=lambda t: -t[0])  # stable: ties keep the model's order
        share = self.tail_share if tail_share is None else tail_share
        in_lane = tail if tail is not None and share > 0 else [False] * len(candidates)  # no lane: none
        heads = [(score, i) for score, i in scored if not in_lane[i]]
        tails = [(score, i) for score, i in scored if in_lane[i]]
        chosen: list[tuple[int, float]] = []
        per_category: Counter[str] = Counter(listed)
        h = t = taken_tail = 0

        def allowed(i: int) -> bool:  # the cap only tightens as the list grows: a refused item stays refused
            return self.max_per_category is None or per_category[candidates[i][1]] < self.max_per_category

        while len(chosen) < k:
            while h < len(heads) and not allowed(heads[h][1]):
                h += 1
            while t < len(tails) and not allowed(tails[t][1]):
                t += 1
            if h == len(heads) and t == len(tails):
                break
            due = math.floor((len(chosen) + 1) * share + 1e-9) > taken_tail  # this position needs a tail item
            use_tail = t < len(tails) and (due or h == len(heads) or tails[t][0] > heads[h][0])
            score, i = tails[t] if use_tail else heads[h]
            if use_tail:
                t, taken_tail = t + 1, taken_tail + 1
            else:
                h += 1
            per_category[candidates[i][1]] += 1
            chosen.append((i, score))
        return chosen
