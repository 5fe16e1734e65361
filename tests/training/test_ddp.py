"""Two CPU processes under torchrun (gloo) train like one process with the same global batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from dinrec.models.bundle import load_bundle
from tests.conftest import REPO, free_port, synthetic_dataset_dir

# No BatchNorm (Dice) here: DDP ranks normalise over their own half-batch, one process over the whole.
ENV = {"DINREC_TRAIN_ATTENTION_ACTIVATION": "prelu", "DINREC_TRAIN_MLP_ACTIVATION": "relu",
       "DINREC_TRAIN_ITEM_DIM": "8", "DINREC_TRAIN_CAT_DIM": "8", "DINREC_TRAIN_THREADS": "1"}


def _run(cmd: list[str], out, *extra: str) -> dict:
    env = {**os.environ, **ENV}
    p = subprocess.run(cmd + ["--out", str(out), "--batch-size", "256", "--device", "cpu", "--no-progress", *extra],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


# Adam moves a weight by at most lr·(1−β1)/√(1−β2) per step (Kingma & Ba 2015, §2.1; the defaults here: lr 1e-3,
# β 0.9 / 0.999), so two runs that differ only in rounding end at most twice that per step apart.
ADAM_STEP_BOUND = 1e-3 * (1 - 0.9) / (1 - 0.999) ** 0.5
STEPS = 6


def _close(a: torch.nn.Module, b: torch.nn.Module, within: float, most: float, share: float = 0.99) -> None:
    """Every weight within ``within`` and ``share`` of them within ``most``: two ranks sum a gradient in
    another order than one process, and where it nearly cancels Adam's first step (g/|g|) carries that
    rounding whole — a few weights drift by float order, not by a wrong update (which moves them all).
    How far those few drift depends on the CPU's rounding (1e-3 on an AVX-512 box, 1.4e-3 with AVX2), so
    ``within`` is the optimizer's bound, not one machine's figure; the share within ``most`` is what shows
    the updates are the same."""
    xs = torch.cat([x.flatten().float() for _, x in sorted(a.state_dict().items())])
    ys = torch.cat([y.flatten().float() for _, y in sorted(b.state_dict().items())])
    diff = (xs - ys).abs()
    assert float(diff.max()) < within, float(diff.max())
    assert float((diff < most).float().mean()) >= share, float((diff < most).float().mean())


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["listwise", "pointwise"])
def test_two_gloo_ranks_match_one_process(tmp_path, objective):
    """The same global batch on two ranks (each its share; listwise, each builds the whole step's lists and
    takes its rows) trains like one process: after a few steps the weights agree to float order."""
    data = synthetic_dataset_dir(tmp_path / "data", n_users=200, n_items=150, n_categories=8,
                                 mean_events_per_user=20, seed=5)
    train = ["-m", "dinrec.cli.main", "train", "--data", str(data), "--objective", objective, "--epochs", "1",
             "--max-steps", str(STEPS), "--patience", "0"]
    one = _run([sys.executable, *train], tmp_path / "one")
    two = _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
                *train], tmp_path / "two")
    assert one["world_size"] == 1 and two["world_size"] == 2 and one["global_step"] == two["global_step"] == STEPS
    a, b = load_bundle(tmp_path / "one" / "bundle").model, load_bundle(tmp_path / "two" / "bundle").model
    _close(a, b, within=2 * STEPS * ADAM_STEP_BOUND, most=1e-5)
    assert abs(one["test_gauc"] - two["test_gauc"]) < 0.005
