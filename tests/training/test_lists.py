"""Listwise training data (training.lists): negatives like serving's candidates, and the guards that keep a
training sample from seeing its own behaviour."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dinrec.datasets.synthetic import SyntheticConfig, generate
from dinrec.retrieval.baselines import ItemCF, ItemCFConfig
from dinrec.retrieval.covisit import CoVisitation
from dinrec.training.lists import ListData, ListSettings
from dinrec.training.samples import build_samples, training_ends, training_sequences


@pytest.fixture(scope="module")
def lists():
    from dinrec.training.run import train_towers
    from dinrec.training.towers_train import TowersSettings

    data = generate(SyntheticConfig(n_users=150, n_items=120, n_categories=6, mean_events_per_user=20, seed=5))
    samples = build_samples(data, seq_len=20)
    towers = train_towers(samples, TowersSettings(dim=8, epochs=2)).model
    seqs = training_sequences(samples)
    lane = CoVisitation.from_item_cf(ItemCF.fit(seqs, samples.vocab.n_items, ItemCFConfig(window=5)), neighbours=30)
    return ListData(samples, ListSettings(negatives=16, hard_share=0.5, guard_folds=3, recall_candidates=40,
                                          covisit_candidates=20), towers, lane, seq_len=20)


def test_negatives_are_never_the_positive_nor_anything_the_user_took(lists):
    samples = lists.samples
    rows = lists.positives[:64]
    batch = lists.batch(np.arange(64), epoch=0, step=0)
    assert batch.cand_items.shape == (64, 17) and batch.valid[:, 0].all()
    train = samples.train
    for r, (cand, ok) in enumerate(zip(batch.cand_items.tolist(), batch.valid.tolist(), strict=True)):
        taken = set(samples.seq_items[samples.before(train, rows[r])].tolist())
        assert cand[0] == train.target_item[rows[r]]
        for c, valid in zip(cand[1:], ok[1:], strict=True):
            if valid:
                assert c != cand[0] and c not in taken and c != 0


def test_hard_negatives_come_from_the_lanes_pool_and_popular_ones_carry_their_log_q(lists):
    rows = lists.positives[:32]
    batch = lists.batch(np.arange(32), epoch=0, step=3)
    hist, cats, _ = lists._histories(lists.samples.train, rows)
    pool = lists.pool(lists.samples.train, rows, hist, cats, guarded=True)
    hard = lists.s.hard
    for r in range(len(rows)):
        members = set(pool[r].tolist()) - {-1}
        picked = [c for c, ok in zip(batch.cand_items[r, 1:1 + hard].tolist(), batch.valid[r, 1:1 + hard].tolist(),
                                     strict=True) if ok]
        assert set(picked) <= members
    assert (batch.log_q[:, :1 + hard] == 0).all()
    popular = batch.cand_items[:, 1 + hard:]
    expected = torch.log((lists.s.negatives - hard) * lists.popular_p[popular]).float()
    assert torch.allclose(batch.log_q[:, 1 + hard:], expected)


def test_a_step_draws_the_same_lists_after_a_restart_and_others_the_next_step(lists):
    idx = np.arange(16)
    a, b, c = lists.batch(idx, 2, 7), lists.batch(idx, 2, 7), lists.batch(idx, 2, 8)
    assert torch.equal(a.cand_items, b.cand_items) and torch.equal(a.valid, b.valid)
    assert not torch.equal(a.cand_items, c.cand_items)


def test_a_training_positive_never_sees_its_own_co_visitation_nor_its_own_count(lists):
    """The guard: a user's pair similarities come from the lane fitted without their fold, their
    candidates' counts less their own. Validation (as serving) reads the served lane and counts."""
    train = lists.samples.train
    rows = lists.positives
    user = torch.from_numpy(train.user[rows])
    hist, cats, gaps = lists._histories(train, rows)
    target = torch.from_numpy(train.target_item[rows]).unsqueeze(1)  # (B, 1)
    guarded = lists.context(user, hist, cats, gaps, target, guarded=True)
    served = lists.context(user, hist, cats, gaps, target, guarded=False)
    # The served lane counts the user's own pair (newest behaviour → target) where they are adjacent:
    newest = hist[:, -1]
    adjacent = served.pairs[:, 0, -1, 0] > 0
    assert adjacent.any()
    folds = lists.folds[user.numpy()]
    for r in np.flatnonzero(adjacent.numpy())[:50]:
        lane = lists.fold_lanes[folds[r]]
        sim = lane.weights[int(newest[r])][lane.neighbours[int(newest[r])] == int(target[r, 0])]
        assert guarded.pairs[r, 0, -1, 0].item() == pytest.approx(float(sim[0]) if len(sim) else 0.0)
    # Counts: the served count includes this user's own behaviours with the item; the guarded one does not.
    own = lists._own(user, target)
    assert (own >= 1).all()  # a training target is one of the user's training behaviours
    assert torch.allclose(torch.expm1(served.candidates[..., 0]) - torch.expm1(guarded.candidates[..., 0]), own,
                          atol=1e-3)


def test_a_lane_without_a_users_fold_has_none_of_their_pairs(lists):
    """A pair only one user ever made is in the served lane and in no fold lane that user reads."""
    samples = lists.samples
    ends = training_ends(samples)
    pairs: dict[tuple[int, int], set[int]] = {}
    for u, (a, b) in enumerate(zip(samples.user_offsets[:-1].tolist(), ends.tolist(), strict=True)):
        seq = samples.seq_items[a:b].tolist()
        for d in range(1, lists.lane.cfg.window + 1):  # the lane's co-visitation window, both ways
            for x, y in zip(seq, seq[d:], strict=False):
                pairs.setdefault((x, y), set()).add(u)
                pairs.setdefault((y, x), set()).add(u)
    lone = [(p, next(iter(us))) for p, us in pairs.items() if len(us) == 1 and p[0] != p[1]]
    assert lone
    for (x, y), u in lone[:100]:
        lane = lists.fold_lanes[lists.folds[u]]
        assert not ((lane.neighbours[x] == y) & (lane.weights[x] > 0)).any()


def test_the_list_loss_adds_the_mini_batch_aware_l2_of_the_rows_its_lists_touch(lists):
    """mba_l2 (the DIN paper's regulariser) on the listwise objective: λ · Σ ‖row‖² / frequency over the item
    and category rows of the batch's histories and candidates, negatives included, padding not — computed
    here row by row, apart from the implementation's unique-and-gather."""
    from dinrec.models.din import DIN
    from dinrec.training.loop import DINListLoss, MiniBatchL2, _frequencies, model_config_for
    from dinrec.training.settings import TrainSettings

    samples = lists.samples
    model = DIN(model_config_for(samples, TrainSettings(seq_len=20, progress=False))).eval()
    item_freq, cat_freq = _frequencies(samples)
    b = lists.batch(np.arange(32), epoch=0, step=0)
    c = b.context
    args = (b.hist_items, b.hist_cats, b.cand_items, b.cand_cats, c.gaps, c.pairs, c.candidates, b.valid, b.log_q)
    with torch.no_grad():
        plain = DINListLoss(model)(*args)
        regularised = DINListLoss(model, MiniBatchL2(0.5, item_freq, cat_freq))(*args)

    def penalty(table, freq, *ids):
        rows = {int(r) for t in ids for r in t.reshape(-1).tolist()} - {0}
        return sum(float(table[r].pow(2).sum()) / max(int(freq[r]), 1) for r in rows)

    with torch.no_grad():
        expected = 0.5 * (penalty(model.item_emb.weight, item_freq, b.hist_items, b.cand_items)
                          + penalty(model.cat_emb.weight, cat_freq, b.hist_cats, b.cand_cats))
    assert expected > 0
    assert float(regularised - plain) == pytest.approx(expected, rel=1e-4)
    TrainSettings(mba_l2=0.1)  # the listwise default objective takes it (it was the pointwise one's alone)
