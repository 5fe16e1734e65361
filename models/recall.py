"""The recall space, defined once for export (the FAISS index) and serving (the query).

A bundle with recall towers (models.towers) recalls with them: the index holds the item tower's
unit vectors and a history's query is the user tower's. A bundle without (written before the towers
existed, or trained with ``recall_epochs=0``) falls back to DIN's item embeddings and the mean of the
history's vectors — what the recall benchmark calls ``din_mean``.
"""

from __future__ import annotations

import numpy as np
import torch

from dinrec.models.din import DIN
from dinrec.models.towers import Towers
from dinrec.retrieval.hits import row_ranks


class RecallSpace:
    def __init__(self, model: DIN, towers: Towers | None, item_category: np.ndarray) -> None:
        self.towers = towers.eval() if towers is not None else None
        self.item_category = torch.as_tensor(item_category, dtype=torch.long)  # (I,)
        with torch.inference_mode():
            table = towers.item_table(self.item_category) if towers is not None else model.item_emb.weight
            self.item_vectors = table.detach().float().cpu().numpy()  # (I, D); row 0 = padding

    @property
    def kind(self) -> str:
        return "towers" if self.towers is not None else "din_mean"

    @property
    def dim(self) -> int:
        return self.item_vectors.shape[1]

    @torch.inference_mode()
    def queries(self, hist_items: torch.Tensor, hist_cats: torch.Tensor) -> np.ndarray:
        """(B, L), (B, L) left-padded index tensors → (B, D) float32 queries. Unknown items (index 0)
        still count through their category with towers; the mean ignores them."""
        if self.towers is not None:
            return self.towers.users(hist_items, hist_cats).float().numpy()
        vectors = torch.from_numpy(self.item_vectors)[hist_items]  # (B, L, D); row 0 is zeros
        known = (hist_items != 0).sum(dim=1, keepdim=True).clamp_min(1)  # (B, 1)
        return (vectors.sum(dim=1) / known).numpy()

    def query(self, items: list[int], cats: list[int]) -> np.ndarray:
        """One history (oldest first) → (1, D)."""
        return self.queries(torch.tensor([items], dtype=torch.long), torch.tensor([cats], dtype=torch.long))

    def cold_item_vectors(self, categories: torch.Tensor) -> np.ndarray | None:
        """(C,) category indices → (C, D) vectors of items the model has never seen, placed by their
        category alone (towers only: None without them)."""
        if self.towers is None:
            return None
        with torch.inference_mode():
            return self.towers.items(torch.zeros_like(categories), categories).float().numpy()


def top_unseen(scores: torch.Tensor, history: torch.Tensor, k: int) -> torch.Tensor:
    """(B, k) the best-scoring items of each row of ``scores`` (B, I), never padding (item 0) nor an
    item in that row's ``history`` (B, L): the exact recall HR@k is measured on. Overwrites ``scores``."""
    scores[:, 0] = -torch.inf
    scores.scatter_(1, history, -torch.inf)
    return scores.topk(min(k, scores.shape[1] - 1), dim=1).indices


def target_found(top: torch.Tensor, target: torch.Tensor) -> np.ndarray:
    """(B,) bool: whether each row's ``target`` (B,) is among its ``top`` (B, k); a target of 0 (an
    item the model cannot recall) never is."""
    wanted = target.numpy()
    return (row_ranks(top.numpy(), wanted) >= 0) & (wanted != 0)
