"""Row-wise Adagrad (the sharded tables' optimizer, in plain PyTorch) and the tables' optimizer settings."""

from __future__ import annotations

import pytest
import torch

from dinrec.training.optim import RowWiseAdagrad
from dinrec.training.settings import ROWWISE_ADAGRAD_LR, TrainSettings


def test_one_state_value_per_row_and_untouched_rows_stay():
    w = torch.nn.Parameter(torch.ones(4, 3))
    opt = RowWiseAdagrad([w], lr=0.1)
    g = torch.tensor([[1.0, 2.0, 2.0], [0.0, 0.0, 0.0], [3.0, 0.0, 4.0], [0.0, 0.0, 0.0]])
    for step in (1, 2):
        w.grad = g.clone()
        opt.step()
        state = opt.state[w]["sum"]
        assert state.shape == (4,)  # one value per row, not two per element as Adam keeps
        expected_sum = step * g.pow(2).mean(dim=1)
        torch.testing.assert_close(state, expected_sum)
    # w −= lr · g / √s, step by step: rows 1 and 3 had no gradient and have not moved
    ms = g.pow(2).mean(dim=1, keepdim=True)  # (4, 1)
    first, second = 0.1 * g / (ms.sqrt() + 1e-8), 0.1 * g / ((2 * ms).sqrt() + 1e-8)
    torch.testing.assert_close(w.detach(), torch.ones(4, 3) - first - second)
    assert torch.equal(w.detach()[[1, 3]], torch.ones(2, 3))


def test_a_sparse_gradient_updates_as_the_dense_one_does():
    dense_w = torch.nn.Parameter(torch.randn(6, 4, generator=torch.Generator().manual_seed(0)))
    sparse_w = torch.nn.Parameter(dense_w.detach().clone())
    dense_opt, sparse_opt = RowWiseAdagrad([dense_w], lr=0.05), RowWiseAdagrad([sparse_w], lr=0.05)
    idx = torch.tensor([4, 1, 4, 0])  # row 4 looked up twice: its gradients add up
    for _ in range(3):
        for w, opt, sparse in ((dense_w, dense_opt, False), (sparse_w, sparse_opt, True)):
            opt.zero_grad()
            torch.nn.functional.embedding(idx, w, sparse=sparse).pow(2).sum().backward()
            opt.step()
    torch.testing.assert_close(dense_w.detach(), sparse_w.detach())


def test_the_tables_learning_rate_follows_their_optimizer():
    assert TrainSettings().table_lr is None  # Adam: the model's own lr
    assert TrainSettings(embedding_optimizer="rowwise_adagrad").table_lr == ROWWISE_ADAGRAD_LR
    assert TrainSettings(embeddings="sharded", objective="pointwise").table_optimizer == "rowwise_adagrad"
    assert TrainSettings(embeddings="sharded", objective="pointwise", embedding_lr=0.3).table_lr == 0.3


@pytest.mark.parametrize("bad", [{"embedding_optimizer": "adam"}, {"mba_l2": 0.1}, {"patience": 2},
                                 {"precision": "fp16"}, {"warmup_steps": 5}])
def test_sharded_tables_refuse_what_they_cannot_do_at_start_up(bad):
    with pytest.raises(ValueError, match="sharded tables"):
        TrainSettings(embeddings="sharded", objective="pointwise", **bad)


def test_a_sharding_type_without_sharded_tables_is_an_error():
    with pytest.raises(ValueError, match="embedding_sharding"):
        TrainSettings(embedding_sharding="row_wise")
