"""The benchmark harness runs and prints the JSON the README's table is made from (no timings asserted)."""

import json
import subprocess
import sys

import pytest

from feature_store.datasets.synthetic import SyntheticConfig, generate
from feature_store.schema import dumps_many
from tests.conftest import REPO


@pytest.mark.slow
def test_bench_train_vs_deepctr_prints_both_sides(tmp_path):
    pytest.importorskip("deepctr_torch", reason="the peer is in the optional `bench` extra")
    (tmp_path / "events.jsonl").write_text(
        dumps_many(list(generate(SyntheticConfig(n_users=120, n_items=90, n_categories=6, seed=2)).events())))
    out = subprocess.run([sys.executable, "-m", "dinrec_cli.main", "bench", "train", "--data", str(tmp_path),
                          "--vs", "deepctr", "--epochs", "1", "--seq-len", "20", "--seeds", "0,1", "--json"],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)  # stdout is exactly one JSON object: the peer's chatter goes to stderr
    for side in ("dinrec", "deepctr"):
        assert {"samples_per_s", "test_auc", "test_gauc"} <= set(result[side])
        assert result[side]["samples_per_s"] > 0 and 0 <= result[side]["test_gauc"] <= 1
        runs = result[side]["runs"]  # one run per seed; the top level is their mean
        assert [r["seed"] for r in runs] == [0, 1]
        assert result[side]["test_gauc"] == pytest.approx(sum(r["test_gauc"] for r in runs) / 2)
    assert result["speedup"] == pytest.approx(result["dinrec"]["samples_per_s"] / result["deepctr"]["samples_per_s"])
