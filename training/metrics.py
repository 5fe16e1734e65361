"""AUC, GAUC (per-user AUC weighted by impressions, as the DIN paper reports) and logloss."""

from __future__ import annotations

import numpy as np


def _rank_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Mann-Whitney AUC with average ranks for ties; NaN when one class is absent."""
    pos = labels > 0.5
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    ranks = np.empty(len(s), dtype=np.float64)
    # average rank within runs of equal scores
    boundaries = np.flatnonzero(np.r_[True, s[1:] != s[:-1], True])
    for a, b in zip(boundaries[:-1], boundaries[1:], strict=True):
        ranks[a:b] = (a + b + 1) / 2.0  # mean of 1-based ranks a+1..b
    r = np.empty_like(ranks)
    r[order] = ranks
    return float((r[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    return _rank_auc(np.asarray(labels), np.asarray(scores, dtype=np.float64))


def gauc(users: np.ndarray, labels: np.ndarray, scores: np.ndarray) -> float:
    """Σ_u n_u·AUC_u / Σ_u n_u over users whose samples hold both classes."""
    users, labels, scores = np.asarray(users), np.asarray(labels), np.asarray(scores, dtype=np.float64)
    order = np.argsort(users, kind="stable")
    users, labels, scores = users[order], labels[order], scores[order]
    cuts = np.flatnonzero(np.r_[True, users[1:] != users[:-1], True])
    total, weight = 0.0, 0
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        value = _rank_auc(labels[a:b], scores[a:b])
        if not np.isnan(value):
            total += (b - a) * value
            weight += b - a
    return total / weight if weight else float("nan")


def logloss(labels: np.ndarray, logits: np.ndarray) -> float:
    """Mean binary cross-entropy from logits (numerically stable)."""
    y, z = np.asarray(labels, dtype=np.float64), np.asarray(logits, dtype=np.float64)
    return float(np.mean(np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z)))))
