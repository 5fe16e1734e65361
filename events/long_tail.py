"""The long tail, defined once for every part that counts it.

An item is in the **long tail** when it is outside the **head**: the ``ceil(HEAD_SHARE · n)`` most
popular of the ``n`` items with at least one behaviour, ranked by behaviour count, ties by item id
descending (Redis's ZREVRANK order, which the store's ingest script uses). An item with no
behaviour is in the tail. The same rule reads two sources, by design: the serving lane and the
benches read a bundle's training counts (what the model was trained on), the A/B dashboard's
long-tail click share the store's live counts at the time of the click (what users have done
since) — so "tail" means the same thing wherever it is shown, over the counts each part has.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

HEAD_SHARE = 0.2  # the head: the most popular fifth of the items seen


def head_size(n_seen: int) -> int:
    """How many of ``n_seen`` items (with at least one behaviour) are the head."""
    return math.ceil(HEAD_SHARE * n_seen) if n_seen > 0 else 0


def long_tail_mask(counts: np.ndarray) -> np.ndarray:
    """(n_items,) behaviour counts by item index (index order = item-id order; 0 is padding) →
    (n_items,) bool, True for the long tail. Padding is never tail."""
    seen = np.flatnonzero(counts > 0)
    ranked = seen[np.lexsort((-seen, -counts[seen]))]  # count descending, then item (id) descending
    tail = np.ones(len(counts), dtype=bool)
    tail[ranked[:head_size(len(seen))]] = False
    if len(tail):
        tail[0] = False
    return tail


def head_of(counts: Mapping[str, float]) -> set[str]:
    """The head of a live ``{item id: count}`` (items with a count above 0), as :func:`long_tail_mask`
    ranks it."""
    ranked = sorted(((c, i) for i, c in counts.items() if c > 0), reverse=True)
    return {i for _, i in ranked[:head_size(len(ranked))]}
