"""The request path: history → query vector → FAISS recall → DIN scores (training.scorer) → top-k.

Built once per bundle (the service swaps the whole Recommender when a new bundle loads).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from feature_store.features import HistoryItem
from retrieval.index import FaissIndex
from training.bundle import Bundle
from training.scorer import Scorer, choose_precision


@dataclass(frozen=True)
class Scored:
    item_id: str
    category_id: str
    score: float


@dataclass(frozen=True)
class Ranking:
    items: list[Scored]
    strategy: str  # "din" (recall + rank) or "popular" (no usable history)
    known_history: int  # behaviours the model recognised


class Recommender:
    def __init__(self, bundle: Bundle, index: FaissIndex, recall_candidates: int = 200,
                 precision: str = "auto") -> None:
        self.bundle = bundle
        self.model = bundle.model.eval()
        self.index = index
        self.recall_candidates = recall_candidates
        self.seq_len = int(bundle.metrics.get("seq_len", 50))
        self._item_idx = bundle.vocab.item_index()
        self._cat_idx = {c: i for i, c in enumerate(bundle.vocab.categories) if i != 0}
        self._item_cat = torch.as_tensor(bundle.vocab.item_category, dtype=torch.long)
        self._item_vectors = self.model.item_emb.weight.detach().float().numpy()  # (n_items, item_dim)
        chosen, self.precision_error = choose_precision(self.model, self._item_cat, precision, self._probes())
        self.scorer = Scorer(self.model, self._item_cat, chosen)

    def _probes(self, n: int = 4) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """A few made-up requests over this bundle's vocabulary, to check a faster precision against fp32."""
        g = torch.Generator().manual_seed(0)
        n_items = len(self.bundle.vocab.items)
        out = []
        for _ in range(n):
            hist = torch.randint(1, n_items, (self.seq_len,), generator=g)  # (L,)
            cand = torch.randint(1, n_items, (min(self.recall_candidates, n_items - 1),), generator=g)  # (N,)
            out.append((hist, self._item_cat[hist], cand))
        return out

    @property
    def precision(self) -> str:
        return self.scorer.precision

    @property
    def model_version(self) -> str:
        return self.bundle.model_version

    def _encode(self, history: list[HistoryItem]) -> tuple[list[int], list[int]]:
        hist = history[-self.seq_len:]
        return ([self._item_idx.get(h.item_id, 0) for h in hist], [self._cat_idx.get(h.category_id, 0) for h in hist])

    @torch.inference_mode()
    def rank(self, history: list[HistoryItem], k: int, popular: Callable[[int], list[tuple[str, float]]]) -> Ranking:
        """``popular(n)``: the n most popular (item, count), called only when no behaviour is usable."""
        items, cats = self._encode(history)
        known = [i for i in items if i]
        if not known:
            return self.rank_by_popularity(history, k, popular)

        query = self._item_vectors[known].mean(axis=0, keepdims=True)  # (1, item_dim)
        cand, _ = self.index.search(query, self.recall_candidates, exclude=[set(known)])
        cand = cand[0][cand[0] >= 0]  # (N,)
        if len(cand) == 0:
            return Ranking([], "din", len(known))
        logits = self.scorer.score(torch.as_tensor(items, dtype=torch.long), torch.as_tensor(cats, dtype=torch.long),
                                   torch.as_tensor(cand, dtype=torch.long)).logits  # (N,)
        scores = torch.sigmoid(logits).numpy()
        order = np.argsort(-scores, kind="stable")[:k]
        vocab = self.bundle.vocab
        return Ranking([Scored(vocab.items[cand[j]], vocab.categories[vocab.item_category[cand[j]]],
                               float(scores[j])) for j in order], "din", len(known))

    def rank_by_popularity(self, history: list[HistoryItem], k: int,
                           popular: Callable[[int], list[tuple[str, float]]]) -> Ranking:
        """The ``k`` most popular items the user has not interacted with; score relative to the top item."""
        seen_ids = {h.item_id for h in history}
        ranked = popular(k + len(seen_ids))
        top = [(i, s) for i, s in ranked if i not in seen_ids][:k]
        peak = max((s for _, s in ranked), default=1.0) or 1.0
        return Ranking([Scored(i, self._category_of(i), s / peak) for i, s in top], "popular", 0)

    def _category_of(self, item_id: str) -> str:
        idx = self._item_idx.get(item_id)
        return self.bundle.vocab.categories[self.bundle.vocab.item_category[idx]] if idx else "unknown"
