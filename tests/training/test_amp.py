"""Precision is chosen from the device; on this CPU-only suite: fp32 by default, bf16 on request."""

from typing import cast

import pytest
import torch

from dinrec.datasets.synthetic import SyntheticConfig, generate
from dinrec.models.din import DIN
from dinrec.training.amp import choose_precision
from dinrec.training.run import train
from dinrec.training.samples import build_samples
from dinrec.training.settings import TrainSettings


def test_cpu_defaults_to_fp32_and_bf16_is_opt_in():
    cpu = torch.device("cpu")
    assert choose_precision(cpu).name == "fp32" and choose_precision(cpu).dtype is None
    assert choose_precision(cpu, "bf16").dtype == torch.bfloat16
    assert not choose_precision(cpu, "bf16").needs_scaler
    with pytest.raises(ValueError, match="fp16 autocast needs a CUDA device"):
        choose_precision(cpu, "fp16")
    with pytest.raises(ValueError, match="precision must be one of"):
        choose_precision(cpu, "int8")


def test_bf16_autocast_trains_on_cpu_and_reports_its_precision():
    samples = build_samples(generate(SyntheticConfig(n_users=60, n_items=50, n_categories=5, seed=1)), seq_len=10)
    m = train(samples, TrainSettings(epochs=1, precision="bf16", progress=False, item_dim=8, cat_dim=8,
                                     objective="pointwise")).metrics
    assert m["precision"] == "bf16" and 0.0 <= m["test_auc"] <= 1.0 and m["peak_rss_mb"] > 0


class _Half(torch.nn.Module):
    """A stand-in DIN whose logits come out of autocast in fp16, near fp16's largest value."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = logits

    def score_lists(self, *args, **kwargs) -> torch.Tensor:
        return self.logits


def test_the_list_loss_leaves_fp16_before_the_log_q_correction_and_the_softmax():
    """128 negatives, logits up to 65,480 (fp16's largest is 65,504) corrected by −log(K·q) of rare items: in
    fp16 the subtraction overflows to inf and the softmax to nan; the loss takes them to fp32 first."""
    from dinrec.training.loop import DINListLoss

    g = torch.Generator().manual_seed(0)
    logits32 = torch.cat([torch.full((4, 1), 65480.0), 65480.0 - torch.rand(4, 128, generator=g) * 10], dim=1)
    log_q = torch.cat([torch.zeros(4, 1), -torch.rand(4, 128, generator=g) * 10 - 50], dim=1)  # rare: log_q ≪ 0
    valid = torch.ones(4, 129, dtype=torch.bool)
    args = (None, None, None, None, None, None, None, valid, log_q)
    half = DINListLoss(cast(DIN, _Half(logits32.half())))(*args)  # a stand-in: only score_lists is called
    exact = torch.nn.functional.cross_entropy(logits32.half().float() - log_q, torch.zeros(4, dtype=torch.long))
    assert torch.isfinite(half) and torch.allclose(half, exact)
    naive = logits32.half() - log_q.half()  # what fp16 arithmetic would have done
    assert not torch.isfinite(naive).all()
