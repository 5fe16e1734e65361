"""Where a held-out target sits in a ranked list: the one definition behind every HR@k and NDCG@k the
project reports — the baselines' tuning, the towers' recall, the gate's served list, the benches.

A rank is the target's 0-based position in the list (best first), -1 where the list does not hold it.
A target counts once, at its first position. HR@k is ``0 <= rank < k``; NDCG@k with one relevant item is
``1 / log2(rank + 2)`` for a hit, 0 otherwise.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

import numpy as np


def rank_of(ranked: Sequence[Hashable] | np.ndarray, target: Hashable) -> int:
    """``target``'s position in ``ranked`` (best first), -1 where absent."""
    if isinstance(ranked, np.ndarray):
        where = np.flatnonzero(ranked == target)
        return int(where[0]) if len(where) else -1
    for position, item in enumerate(ranked):
        if item == target:
            return position
    return -1


def ranks(lists: Iterable[Sequence[Hashable] | np.ndarray], targets: Iterable[Hashable]) -> np.ndarray:
    """(n,) int64: each target's rank in its list (``lists`` and ``targets`` pairwise, equally long)."""
    return np.asarray([rank_of(ranked, target) for ranked, target in zip(lists, targets, strict=True)],
                      dtype=np.int64)


def row_ranks(top: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """(B,) int64 ranks of ``targets`` (B,) in the rows of ``top`` (B, k): :func:`ranks` for a block."""
    match = top == np.asarray(targets).reshape(-1, 1)  # (B, k)
    return np.where(match.any(axis=1), match.argmax(axis=1), -1).astype(np.int64)


def hit_at(rank: np.ndarray, k: int) -> np.ndarray:
    """(n,) bool: the target among the first ``k``."""
    rank = np.asarray(rank)
    return (rank >= 0) & (rank < k)


def ndcg_at(rank: np.ndarray, k: int) -> np.ndarray:
    """(n,) float: NDCG@k of one relevant item per list."""
    rank = np.asarray(rank)
    return np.where(hit_at(rank, k), 1.0 / np.log2(np.maximum(rank, 0) + 2.0), 0.0)
