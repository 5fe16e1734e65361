from __future__ import annotations

import pytest
import torch

from dinrec.models.din import DIN, Dice, DINConfig
from dinrec.training.loop import DINWithLoss


@pytest.fixture
def model() -> DIN:
    torch.manual_seed(0)
    return DIN(DINConfig(n_items=50, n_categories=7, item_dim=8, cat_dim=4)).eval()


def test_shapes(model):
    b, length = 6, 9
    hist = torch.randint(0, 50, (b, length))
    logits = model(hist, hist % 7, torch.randint(1, 50, (b,)), torch.randint(1, 7, (b,)))
    assert logits.shape == (b,) and torch.isfinite(logits).all()


def test_padding_changes_nothing(model):
    items = torch.tensor([[3, 9, 14]])
    cats = torch.tensor([[1, 2, 3]])
    target, tcat = torch.tensor([5]), torch.tensor([2])
    short = model(items, cats, target, tcat)
    padded = model(torch.tensor([[0, 0, 0, 0, 3, 9, 14]]), torch.tensor([[0, 0, 0, 0, 1, 2, 3]]), target, tcat)
    torch.testing.assert_close(short, padded, rtol=0, atol=1e-6)


def test_padding_row_gets_no_gradient_and_stays_zero():
    torch.manual_seed(0)
    m = DIN(DINConfig(n_items=20, n_categories=4, item_dim=4, cat_dim=4))
    loss = DINWithLoss(m)(torch.tensor([[0, 0, 2, 3], [0, 4, 5, 6]]), torch.tensor([[0, 0, 1, 1], [0, 2, 2, 3]]),
                          torch.tensor([7, 8]), torch.tensor([1, 2]), torch.tensor([1.0, 0.0]))
    loss.backward()
    grad = m.item_emb.weight.grad
    assert grad is not None and grad[0].abs().sum() == 0 and m.item_emb.weight[0].abs().sum() == 0


def test_attention_depends_on_the_candidate(model):
    # The same history weighs behaviours differently for different candidates (a local activation).
    items, cats = torch.tensor([[3, 9, 14]]), torch.tensor([[1, 2, 3]])
    h = model.embed(items, cats)
    q1, q2 = model.embed(torch.tensor([5]), torch.tensor([2])), model.embed(torch.tensor([6]), torch.tensor([4]))
    mask = torch.ones_like(items, dtype=torch.bool)
    assert not torch.allclose(model.interest(q1, h, mask), model.interest(q2, h, mask))


def test_empty_history_is_finite(model):
    out = model(torch.zeros(2, 5, dtype=torch.long), torch.zeros(2, 5, dtype=torch.long),
                torch.tensor([1, 2]), torch.tensor([1, 1]))
    assert torch.isfinite(out).all()


def test_dice_is_identity_scaled_between_alpha_and_one():
    d = Dice(3).train()
    x = torch.randn(64, 3)
    y = d(x)
    assert y.shape == x.shape
    # with alpha = 0 it gates: output has the sign of x and magnitude <= |x|
    assert ((y * x) >= 0).all() and (y.abs() <= x.abs() + 1e-6).all()
    assert d(torch.randn(4, 5, 3)).shape == (4, 5, 3)


def test_config_round_trips_through_json():
    cfg = DINConfig(n_items=3, n_categories=2, mlp_hidden=(8, 4))
    assert DINConfig.from_json(cfg.to_json()) == cfg


@pytest.mark.parametrize("activation", ["prelu", "dice", "relu"])
def test_jagged_activation_unit_equals_the_papers_padded_form(activation):
    torch.manual_seed(1)
    m = DIN(DINConfig(n_items=40, n_categories=5, item_dim=6, cat_dim=2, attention_activation=activation)).eval()
    items = torch.tensor([[0, 0, 3, 4, 5], [0, 9, 8, 7, 6], [0, 0, 0, 0, 0], [1, 2, 3, 4, 5]])
    cats = items % 5
    mask = items != 0
    query = m.embed(torch.tensor([7, 8, 9, 10]), torch.tensor([1, 2, 3, 4]))
    hist = m.embed(items, cats)  # (B, L, D)
    rows, cols = mask.nonzero(as_tuple=True)
    torch.testing.assert_close(m.interest_jagged(query, hist[rows, cols], rows), m.interest(query, hist, mask))
