"""The co-visitation lane is item-CF cut to each item's nearest neighbours: with room for every
neighbour it scores and recalls exactly as ItemCF does; saved and loaded it is the same."""

from __future__ import annotations

import numpy as np
import pytest

from dinrec.retrieval.baselines import ItemCF, ItemCFConfig
from dinrec.retrieval.covisit import CoVisitation


@pytest.fixture
def item_cf() -> ItemCF:
    rng = np.random.default_rng(0)
    seqs = [rng.integers(1, 60, rng.integers(3, 30)) for _ in range(200)]
    return ItemCF.fit(seqs, 60, ItemCFConfig(window=5, decay=0.8, last=10))


def test_with_every_neighbour_it_is_item_cf(item_cf):
    lane = CoVisitation.from_item_cf(item_cf, neighbours=60)
    history = [5, 9, 9, 13, 40, 2]
    dense = (np.asarray(item_cf.sim[history[::-1]].T @ (0.8 ** np.arange(6)))).ravel()  # (I,) ItemCF's own sum
    cand = np.arange(1, 60)
    assert np.allclose(lane.score(history, cand), dense[1:], rtol=1e-5, atol=1e-6)
    ids, scores = lane.recall(history, 15, excluded=set(history))
    assert ids.tolist() == item_cf.recall(history, 15).tolist()
    assert not set(ids.tolist()) & set(history) and (np.diff(scores) <= 0).all()


def test_cut_to_m_keeps_each_items_strongest_neighbours(item_cf, tmp_path):
    lane = CoVisitation.from_item_cf(item_cf, neighbours=3)
    row = item_cf.sim[7].toarray().ravel()
    assert set(lane.neighbours[7][lane.weights[7] > 0].tolist()) == set(np.argsort(-row)[:3].tolist())
    lane.save(tmp_path / "c.npz")
    back = CoVisitation.load(tmp_path / "c.npz")
    assert back.cfg == lane.cfg and np.array_equal(back.neighbours, lane.neighbours)
    assert back.score([7], np.arange(60)).tolist() == lane.score([7], np.arange(60)).tolist()
    assert lane.score([], np.arange(5)).tolist() == [0.0] * 5 and len(lane.recall([], 5)[0]) == 0
    assert lane.score([7], np.array([1000])).tolist() == [0.0]  # an item the lane never saw


def test_the_pair_tables_batched_scores_are_the_lanes_own(item_cf):
    """PairTable.history_scores (training's batched twin of CoVisitation.score) gives every item the score
    the lane gives it, for left-padded histories of any length, each from the lane its row names."""
    import torch

    from dinrec.retrieval.covisit import PairTable

    lanes = [CoVisitation.from_item_cf(item_cf, neighbours=m) for m in (8, 8)]
    lanes[1] = CoVisitation(lanes[1].neighbours, lanes[1].weights * 2, lanes[1].cfg)  # another lane, other sims
    table = PairTable(lanes)
    histories = [[5, 9, 9, 13, 40, 2], [7], [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]]
    hist = torch.zeros(3, 12, dtype=torch.long)
    for r, h in enumerate(histories):
        hist[r, 12 - len(h):] = torch.tensor(h)
    fold = torch.tensor([0, 1, 1])
    got = table.history_scores(hist, fold, lanes[0].cfg, 60)  # (3, 60)
    for r, h in enumerate(histories):
        want = lanes[int(fold[r])].score(h, np.arange(60))
        assert np.allclose(got[r].numpy(), want, rtol=1e-5, atol=1e-6) and want.max() > 0


def test_the_dense_pair_table_looks_up_what_the_sparse_one_does(item_cf):
    """Training spreads the lanes into a dense table; every (candidate, behaviour) reads the same
    similarity as the lookup over the neighbour rows, unknown behaviours and cold candidates 0."""
    import torch

    from dinrec.retrieval.covisit import PairTable

    lanes = [CoVisitation.from_item_cf(item_cf, neighbours=m) for m in (8, 8, 8)]
    lanes[1] = CoVisitation(lanes[1].neighbours, lanes[1].weights * 2, lanes[1].cfg)
    lanes[2] = CoVisitation(lanes[2].neighbours[::-1].copy(), lanes[2].weights[::-1].copy(), lanes[2].cfg)
    n = lanes[0].n_items
    sparse, dense = PairTable(lanes), PairTable(lanes, dense_max_entries=3 * n * n)
    assert sparse.dense is None and dense.dense is not None
    gen = torch.Generator().manual_seed(0)
    hist = torch.randint(0, n + 5, (16, 12), generator=gen)  # 0: padding; ≥ n: unknown to the lanes
    hist[:, :3] = 0
    cand = torch.randint(0, n + 5, (16, 30), generator=gen)  # ≥ n: cold
    fold = torch.randint(0, 3, (16,), generator=gen)
    want = sparse.lookup(hist, cand, fold)  # (B, N, L)
    assert (want > 0).sum() > 20  # the draw meets real neighbours
    assert torch.equal(dense.lookup(hist, cand, fold), want)
    assert torch.equal(dense.lookup(hist, cand), sparse.lookup(hist, cand))


@pytest.mark.parametrize("candidates", [6, 40])  # fewer than a row's 8 neighbours (training's lists), more (serving)
def test_a_pair_lookup_is_each_pairs_own_similarity_whatever_the_candidates_order_or_repeats(item_cf, candidates):
    """sim(h, c) per (candidate, behaviour), against the lane's rows read one pair at a time: candidates
    listed twice, unsorted, cold (past the lane) or padding; behaviours unknown or padding. Either way
    round the search goes (the shorter side looked up in the other)."""
    import torch

    from dinrec.retrieval.covisit import PairTable

    lane = CoVisitation.from_item_cf(item_cf, neighbours=8)
    n = lane.n_items
    gen = torch.Generator().manual_seed(3)
    hist = torch.randint(0, n + 3, (5, 9), generator=gen)
    cand = torch.randint(1, 20, (5, candidates), generator=gen)  # draws of a few values: repeats
    cand[:, 0], cand[:, 1] = 0, n + 1  # padding, cold
    assert any(len(set(row.tolist())) < candidates for row in cand)
    table = PairTable([lane])
    with torch.inference_mode():  # as serving looks up (the table's scratch is made here), then outside it
        first = table.lookup(hist, cand)
    got = table.lookup(hist, cand)  # (B, N, L)
    assert torch.equal(first, got)
    sim = {(h, c): w for h in range(n) for c, w in zip(lane.neighbours[h].tolist(), lane.weights[h].tolist(),
                                                        strict=True) if w > 0}
    want = torch.tensor([[[sim.get((h, c), 0.0) if 0 < h < n else 0.0 for h in hist[b].tolist()]
                          for c in cand[b].tolist()] for b in range(5)])
    assert torch.equal(got, want) and (want > 0).sum() > 10


def test_a_lane_listing_a_neighbour_twice_is_refused(item_cf):
    from dinrec.retrieval.covisit import PairTable

    lane = CoVisitation.from_item_cf(item_cf, neighbours=8)
    ids = lane.neighbours.copy()
    ids[5, 1] = ids[5, 0]
    with pytest.raises(ValueError, match="twice"):
        PairTable([CoVisitation(ids, lane.weights, lane.cfg)])


def test_the_lanes_scores_read_off_looked_up_pairs_are_its_own_scores(item_cf):
    """The ranking stage reads the blend's co-visitation signals off the pairs DIN's context looked up:
    the same decayed sum over the newest ``last`` behaviours (repeats counted, as the lane counts them),
    and the newest behaviour's own similarity."""
    import torch

    from dinrec.retrieval.covisit import PairTable

    lane = CoVisitation.from_item_cf(item_cf, neighbours=8)  # last 10, decay 0.8
    table = PairTable([lane])
    rng = np.random.default_rng(5)
    for length in (1, 4, 25):  # shorter and longer than the lane's window
        history = rng.integers(1, 60, length)
        history[0] = history[-1]  # a repeat
        cand = rng.permutation(np.arange(1, 60))[:40]
        sims = table.lookup(torch.from_numpy(history)[None], torch.from_numpy(cand)[None])[0].numpy()  # (N, L)
        cf, newest = lane.scores_from_pairs(sims)
        assert np.allclose(cf, lane.score(history.tolist(), cand), rtol=1e-5, atol=1e-6)
        assert np.allclose(newest, lane.score(history[-1:].tolist(), cand), rtol=1e-5, atol=1e-6)
        assert cf.max() > 0
    empty, _ = lane.scores_from_pairs(np.zeros((7, 0), dtype=np.float32))
    assert np.array_equal(empty, np.zeros(7, dtype=np.float32))
