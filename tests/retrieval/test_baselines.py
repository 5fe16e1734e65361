"""The recall baselines the FAISS stage is measured against, and the measures themselves."""

from __future__ import annotations

import numpy as np

from dinrec.retrieval.baselines import ItemCF, ItemCFConfig, Popularity, hit_rate, long_tail_share


def test_item_cf_recalls_what_was_visited_next_to_the_history_and_never_the_history():
    # 1 is followed by 2 in many sequences, by 3 in one; 4 is only ever far from 1.
    seqs = [np.array([1, 2, 5, 6, 7, 8, 4])] * 5 + [np.array([1, 3])]
    cf = ItemCF.fit(seqs, n_items=9, cfg=ItemCFConfig(window=1))
    assert cf.recall([1], 5).tolist() == [2, 3]  # 4 is 6 apart, 5 two: outside the window; never 1 itself
    assert ItemCF.fit(seqs, n_items=9, cfg=ItemCFConfig(window=2)).recall([1], 5).tolist()[0] == 2
    assert 2 not in cf.recall([1, 2], 5).tolist()  # seen items are never recalled


def test_item_cf_weighs_recent_behaviours_more():
    seqs = [np.array([1, 2])] * 3 + [np.array([3, 4])] * 3
    cf = ItemCF.fit(seqs, n_items=5, cfg=ItemCFConfig(window=1, decay=0.5))
    assert cf.recall([1, 3], 2).tolist() == [4, 2]  # 3 is the newer behaviour: its neighbour first
    assert cf.recall([3, 1], 2).tolist() == [2, 4]


def test_popularity_skips_seen_and_unseen_by_anyone_items():
    pop = Popularity(np.array([0, 5, 9, 0, 2]))
    assert pop.recall([2], 10).tolist() == [1, 4]  # 2 is seen; 3 was never seen by anyone


def test_hit_rate_counts_a_hit_only_within_the_first_n():
    lists = {(1,): np.array([7, 8, 9]), (2,): np.array([9, 7])}
    recall = lambda history, n: lists[tuple(history)][:n]  # noqa: E731
    assert hit_rate(recall, [([1], 9), ([2], 9), ([2], 5)], [1, 3]) == {"hr@1": round(1 / 3, 4),
                                                                         "hr@3": round(2 / 3, 4)}


def test_long_tail_share_is_the_share_outside_the_top_fifth():
    counts = np.array([0, 100, 50, 10, 9, 8, 7, 6, 5, 4, 3])  # 10 items seen: the head is items 1 and 2
    assert long_tail_share([[1, 2, 3, 4]], counts) == 0.5
    assert long_tail_share([[1], [2]], counts) == 0.0
