"""DIN's listwise path (models.din.score_lists / lists_from) and its context (models.context)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dinrec.models.context import GAP_BUCKETS, candidate_features, gap_buckets, known_last
from dinrec.models.din import DIN, DINConfig, ListContext, PReLU


def _batch(b: int = 6, length: int = 12, n: int = 7, items: int = 60, cats: int = 5, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    hist = torch.randint(1, items, (b, length), generator=g)
    lengths = torch.randint(1, length + 1, (b,), generator=g)
    hist[torch.arange(length).unsqueeze(0) < (length - lengths).unsqueeze(1)] = 0  # left padding
    item_cat = torch.randint(1, cats, (items,), generator=g)
    item_cat[0] = 0
    cand = torch.randint(1, items, (b, n), generator=g)
    return hist, item_cat[hist], cand, item_cat[cand]


def test_lists_of_a_plain_din_are_its_pointwise_scores():
    """The padded listwise layout computes the paper's function: each candidate's logit equals the
    jagged pointwise forward's for that (history, candidate)."""
    torch.manual_seed(0)
    model = DIN(DINConfig(n_items=60, n_categories=5, item_dim=8, cat_dim=8, attention_hidden=(16, 8))).eval()
    hist, cats, cand, cand_cats = _batch()
    with torch.no_grad():
        lists = model.score_lists(hist, cats, cand, cand_cats)  # (B, N)
        for j in range(cand.shape[1]):
            point = model(hist, cats, cand[:, j], cand_cats[:, j])  # (B,)
            assert torch.allclose(lists[:, j], point, atol=1e-5), j


def _context_model(**extra) -> DIN:
    torch.manual_seed(1)
    cfg = DINConfig(n_items=60, n_categories=5, item_dim=8, cat_dim=8, attention_hidden=(16,), positions=12,
                    time_buckets=GAP_BUCKETS, pair_inputs=1, candidate_inputs=2, cross=True, **extra)
    model = DIN(cfg)
    assert model.gap_bias is not None  # the config reads every context term
    with torch.no_grad():  # the context terms start at zero: give them values, as training would
        for p in (model.position_bias, model.gap_bias.weight, model.pair_weight, model.recency):
            assert p is not None
            p.normal_(0, 0.5)
        model.gap_bias.weight[0].zero_()
    return model.eval()


def _context(hist, cand, seed=2):
    g = torch.Generator().manual_seed(seed)
    ts = torch.cumsum(torch.randint(0, 5000, hist.shape, generator=g), dim=1).double()
    pairs = torch.rand(*cand.shape, hist.shape[1], 1, generator=g) * (torch.rand(*cand.shape, hist.shape[1], 1,
                                                                                generator=g) < 0.3)
    pairs = pairs * (hist != 0).unsqueeze(1).unsqueeze(-1)
    feats = torch.rand(*cand.shape, 2, generator=g)
    return ListContext(gap_buckets(ts, hist != 0), pairs, feats)


def test_left_padding_changes_nothing_with_context():
    model = _context_model()
    hist, cats, cand, cand_cats = _batch()
    ctx = _context(hist, cand)
    with torch.no_grad():
        base = model.score_lists(hist, cats, cand, cand_cats, ctx)
        pad = 5  # five more empty slots on the left: positions count from the newest
        wide = ListContext(torch.nn.functional.pad(ctx.gaps, (pad, 0)),
                           torch.nn.functional.pad(ctx.pairs, (0, 0, pad, 0)), ctx.candidates)
        padded = model.score_lists(torch.nn.functional.pad(hist, (pad, 0)), torch.nn.functional.pad(cats, (pad, 0)),
                                   cand, cand_cats, wide)
    assert torch.allclose(base, padded, atol=1e-5)


def test_order_matters_only_to_a_din_that_reads_positions():
    """The paper's sum pooling is blind to order; with positions, the same behaviours in another order
    score otherwise (the issue: DIN could not tell what the user did last)."""
    hist, cats, cand, cand_cats = _batch(b=1, length=8)
    hist, cats = hist.clone(), cats.clone()
    hist[0, :] = torch.arange(10, 18)
    cats[0, :] = 1
    perm = torch.tensor([7, 6, 5, 4, 3, 2, 1, 0])
    plain = DIN(DINConfig(n_items=60, n_categories=5, item_dim=8, cat_dim=8, attention_hidden=(16,))).eval()
    with torch.no_grad():
        assert torch.allclose(plain.score_lists(hist, cats, cand, cand_cats),
                              plain.score_lists(hist[:, perm], cats[:, perm], cand, cand_cats), atol=1e-5)
        positional = _context_model()
        ctx = ListContext(None, torch.zeros(1, cand.shape[1], 8, 1), torch.zeros(1, cand.shape[1], 2))
        gaps = torch.ones(1, 8, dtype=torch.long)
        a = positional.score_lists(hist, cats, cand, cand_cats, ListContext(gaps, ctx.pairs, ctx.candidates))
        b = positional.score_lists(hist[:, perm], cats[:, perm], cand, cand_cats,
                                   ListContext(gaps, ctx.pairs, ctx.candidates))
    assert not torch.allclose(a, b, atol=1e-4)


def test_every_context_term_is_trained():
    model = _context_model().train()
    hist, cats, cand, cand_cats = _batch()
    loss = model.score_lists(hist, cats, cand, cand_cats, _context(hist, cand)).logsumexp(dim=1).mean()
    loss.backward()
    for name in ("position_bias", "gap_bias.weight", "pair_weight", "recency", "linear.weight"):
        grad = dict(model.named_parameters())[name].grad
        assert grad is not None and grad.abs().sum() > 0, name
    assert "calibration" not in dict(model.named_parameters())  # a buffer: fitted at export, never trained


def test_a_context_model_refuses_a_missing_input_and_a_dice_unit():
    model = _context_model()
    hist, cats, cand, cand_cats = _batch()
    with pytest.raises(ValueError, match="time gaps"):
        model.score_lists(hist, cats, cand, cand_cats, ListContext(None, None, None))
    dice = DIN(DINConfig(n_items=60, n_categories=5, item_dim=8, cat_dim=8, attention_activation="dice"))
    with pytest.raises(ValueError, match="batch statistics"):
        dice.score_lists(hist, cats, cand, cand_cats)


def test_gap_buckets_count_from_the_newest_behaviour():
    ts = torch.tensor([[0.0, 0.0, 100.0, 100.0, 100.0 + 3600, 100.0 + 3600]])
    filled = torch.tensor([[False, True, True, True, True, True]])
    got = gap_buckets(ts, filled)[0].tolist()
    # padding 0; one hour (60 min: 2 + floor(log2 61) = 7); the same second as the newest: 1
    assert got == [0, 7, 7, 7, 1, 1]
    years = gap_buckets(torch.tensor([[0.0, 1e10]]), torch.tensor([[True, True]]))
    assert years[0, 0] == GAP_BUCKETS  # far gaps share the last bucket


def test_candidate_features_read_counts_and_the_recent_categories():
    counts = torch.tensor([[0.0, 9.0]])
    hist_cats = torch.tensor([[0, 0, 3, 3, 4, 3]])  # four real behaviours: three in category 3
    out = candidate_features(counts, torch.tensor([[3, 5]]), hist_cats)
    assert out[0, 0].tolist() == pytest.approx([0.0, 0.75])
    assert out[0, 1].tolist() == pytest.approx([np.log(10.0), 0.0])


def test_known_last_packs_unknown_behaviours_into_the_padding():
    hist = torch.tensor([[0, 5, 0, 7, 8]])  # an unknown item (0) between known ones
    ts = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0]])
    packed, packed_ts = known_last(hist, ts)
    assert packed.tolist() == [[0, 0, 5, 7, 8]] and packed_ts.tolist() == [[0.0, 2.0, 1.0, 3.0, 4.0]]


@pytest.mark.parametrize("shape", [(16, 32), (8, 12)])  # (H, D): an instantiated pair and the generic path
def test_the_fused_listwise_unit_equals_the_pytorch_ops(shape):
    """models.kernels.list_unit (csrc/din_lists.cpp) is the same function as DIN's ops: the logits and every
    gradient, with empty and full histories among the rows."""
    from dinrec.models import kernels

    if not kernels.load_lists():
        pytest.skip("the fused listwise unit could not be built here (see the log)")
    h1, d = shape
    torch.manual_seed(3)
    cfg = DINConfig(n_items=80, n_categories=6, item_dim=d // 2, cat_dim=d - d // 2, attention_hidden=(h1,),
                    positions=12, time_buckets=GAP_BUCKETS, pair_inputs=1, candidate_inputs=2, cross=True)
    model = DIN(cfg)
    assert model.gap_bias is not None and isinstance(model.att_in_act, PReLU)  # every context term; the default unit
    with torch.no_grad():
        for p in (model.position_bias, model.gap_bias.weight, model.pair_weight, model.recency):
            assert p is not None
            p.normal_(0, 0.5)
        model.att_in_act.alpha.uniform_(-0.5, 0.5)  # a wrong α gradient shows
    hist, cats, cand, cand_cats = _batch(b=9, length=12, n=5, items=80, cats=6)
    hist[0] = 0  # an empty history
    hist[1] = torch.arange(1, 13)  # a full one
    cats = cats * (hist != 0)
    ctx = _context(hist, cand)

    def run(fused: bool):
        model.zero_grad()
        model.list_unit = kernels.list_unit if fused else None
        out = model.score_lists(hist, cats, cand, cand_cats, ctx)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        return out.detach(), {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}

    ops, ops_grads = run(False)
    fused, fused_grads = run(True)
    assert torch.allclose(ops, fused, atol=1e-5)
    assert set(ops_grads) == set(fused_grads)
    for name, g in ops_grads.items():
        assert torch.allclose(g, fused_grads[name], atol=1e-5, rtol=1e-4), name
