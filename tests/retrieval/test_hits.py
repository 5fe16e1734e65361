"""The one definition of a target's rank in a list, and HR@k and NDCG@k from it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dinrec.retrieval.hits import hit_at, ndcg_at, rank_of, ranks, row_ranks


def test_a_rank_is_the_first_position_best_first_and_minus_one_where_absent():
    assert rank_of(["i3", "i1", "i2"], "i1") == 1
    assert rank_of(["i3", "i1", "i1"], "i1") == 1  # counted once, at its first place
    assert rank_of(["i3"], "i9") == -1 and rank_of([], "i9") == -1
    assert rank_of(np.array([7, 5, 9]), 9) == 2 and rank_of(np.array([7, 5]), 4) == -1
    assert ranks([[1, 2], [3, 4], np.array([5, 6])], [2, 9, 5]).tolist() == [1, -1, 0]
    with pytest.raises(ValueError):
        ranks([[1], [2]], [1])  # lists and targets pairwise


def test_hr_and_ndcg_at_k():
    rank = np.array([0, 3, 9, 10, -1])
    assert hit_at(rank, 10).tolist() == [True, True, True, False, False]
    assert hit_at(rank, 4).tolist() == [True, True, False, False, False]
    assert ndcg_at(rank, 10) == pytest.approx([1.0, 1 / math.log2(5), 1 / math.log2(11), 0.0, 0.0])


def test_a_block_of_rows_ranks_as_the_lists_do():
    rng = np.random.default_rng(3)
    top = np.stack([rng.permutation(40)[:10] for _ in range(200)])  # (200, 10), distinct per row
    targets = rng.integers(0, 40, 200)
    assert row_ranks(top, targets).tolist() == ranks(list(top), targets.tolist()).tolist()
    assert (row_ranks(top, targets) >= 0).any() and (row_ranks(top, targets) < 0).any()
