"""Two CPU processes under torchrun (gloo) train like one process with the same global batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from models.bundle import load_bundle
from tests.conftest import REPO, free_port, synthetic_dataset_dir

# No BatchNorm (Dice) here: DDP ranks normalise over their own half-batch, one process over the whole.
ENV = {"DINREC_TRAIN_ATTENTION_ACTIVATION": "prelu", "DINREC_TRAIN_MLP_ACTIVATION": "relu",
       "DINREC_TRAIN_ITEM_DIM": "8", "DINREC_TRAIN_CAT_DIM": "8", "DINREC_TRAIN_THREADS": "1"}


def _run(cmd: list[str], out) -> dict:
    env = {**os.environ, **ENV}
    p = subprocess.run(cmd + ["--out", str(out), "--epochs", "2", "--batch-size", "256", "--device", "cpu",
                              "--no-progress"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_two_gloo_ranks_match_one_process(tmp_path):
    data = synthetic_dataset_dir(tmp_path / "data", n_users=200, n_items=150, n_categories=8,
                                 mean_events_per_user=20, seed=5)
    train = ["-m", "dinrec_cli.main", "train", "--data", str(data)]
    one = _run([sys.executable, *train], tmp_path / "one")
    two = _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
                *train], tmp_path / "two")
    assert one["world_size"] == 1 and two["world_size"] == 2
    a, b = load_bundle(tmp_path / "one" / "bundle").model, load_bundle(tmp_path / "two" / "bundle").model
    for (name, x), (_, y) in zip(sorted(a.state_dict().items()), sorted(b.state_dict().items()), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-3, atol=1e-4, msg=lambda m, n=name: f"{n}: {m}")
    assert abs(one["test_gauc"] - two["test_gauc"]) < 0.01
