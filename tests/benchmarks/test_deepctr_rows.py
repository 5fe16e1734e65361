"""The DeepCTR peer trains on the very lists dinrec trained on (benchmarks.deepctr_peer.list_rows): one
labelled row per candidate the listwise loss counted, with that list's history, right-padded as DeepCTR
reads it."""

from __future__ import annotations

import numpy as np
import torch

from dinrec.benchmarks.deepctr_peer import list_rows
from dinrec.datasets.synthetic import SyntheticConfig, generate
from dinrec.retrieval.baselines import ItemCF, ItemCFConfig
from dinrec.retrieval.covisit import CoVisitation
from dinrec.training.lists import ListData, ListSettings
from dinrec.training.samples import build_samples, training_sequences


def test_each_counted_candidate_of_a_list_is_one_row_with_its_lists_history():
    data = generate(SyntheticConfig(n_users=60, n_items=50, n_categories=5, mean_events_per_user=15, seed=3))
    samples = build_samples(data, seq_len=10)
    seqs = training_sequences(samples)
    lane = CoVisitation.from_item_cf(ItemCF.fit(seqs, samples.vocab.n_items, ItemCFConfig(window=5)), neighbours=20)
    lists = ListData(samples, ListSettings(negatives=8, hard_share=0.5, guard_folds=2, recall_candidates=10,
                                           covisit_candidates=10), None, lane, seq_len=10)
    steps = []
    for step, idx in enumerate((np.arange(0, 7), np.arange(7, 12))):
        b = lists.batch(idx, epoch=0, step=step)
        steps.append((lists.positives[idx], b.cand_items, b.valid))
    x, y = list_rows(samples, 10, steps)

    valid = torch.cat([v for _, _, v in steps])  # (12, 9)
    cand = torch.cat([c for _, c, _ in steps])
    assert not valid.all()  # some negatives are not counted (the user's own items): those make no row
    assert len(y) == int(valid.sum()) and y.sum() == 12  # one positive per list
    assert (x["item_id"] == cand[valid].numpy()).all()
    assert (x["cate_id"] == np.asarray(samples.vocab.item_category)[x["item_id"]]).all()
    # Row r's history is its list's: the training row's history, left-padding moved to the right.
    split = samples.train
    list_of_row = valid.nonzero()[:, 0].numpy()
    rows = np.concatenate([r for r, _, _ in steps])
    for r in (0, len(y) // 2, len(y) - 1):
        row = rows[list_of_row[r]]
        n = min(int(split.hist_len[row]), 10)
        end = int(split.hist_end[row])
        assert x["seq_length"][r] == n
        assert (x["hist_item_id"][r, :n] == samples.seq_items[end - n:end]).all()
        assert (x["hist_item_id"][r, n:] == 0).all()
        assert (x["hist_cate_id"][r, :n] == samples.seq_cats[end - n:end]).all()
    assert y[0] == 1 and set(np.unique(y)) == {0.0, 1.0}
