"""Precision is chosen from the device; on this CPU-only suite: fp32 by default, bf16 on request."""

import pytest
import torch

from feature_store.datasets.synthetic import SyntheticConfig, generate
from training.amp import choose_precision
from training.loop import train
from training.samples import build_samples
from training.settings import TrainSettings


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
    m = train(samples, TrainSettings(epochs=1, precision="bf16", progress=False, item_dim=8, cat_dim=8)).metrics
    assert m["precision"] == "bf16" and 0.0 <= m["test_auc"] <= 1.0 and m["peak_rss_mb"] > 0
