"""`dinrec train` from the command line, on a real dataset and on a synthetic one."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dinrec.datasets.synthetic import SyntheticConfig, generate
from dinrec.events.schema import dumps_many
from tests.conftest import REPO, shared_dataset


def run_train(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "dinrec.cli.main", "train", "--no-progress", *args],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_train_on_movielens_100k_prints_auc_and_gauc(tmp_path):
    m = run_train("--data", str(shared_dataset("ml-100k")), "--out", str(tmp_path), "--epochs", "1")
    for key in ("test_auc", "test_gauc", "test_logloss", "samples_per_s", "weights_sha256"):
        assert key in m
    assert m["test_auc"] > 0.7 and m["test_gauc"] > 0.7  # far above chance (0.5) after one epoch
    served = m["served"]  # the served list's HR@10 beside the baselines', as the retrain gate compares them
    assert served["split"] == "test" and served["k"] == 10
    for name in ("popularity", "item_cf"):
        base = served["baselines"][name]
        assert base["dinrec_minus_baseline"]["difference"] == pytest.approx(served["served_hr"] - base["served_hr"],
                                                                            abs=1e-4)
    assert served["served_hr"] > 1.5 * served["baselines"]["popularity"]["served_hr"]
    assert (tmp_path / "bundle" / "manifest.json").is_file() and (tmp_path / "samples" / "samples.json").is_file()
    latest = (tmp_path / "checkpoints" / "latest").read_text()
    assert (tmp_path / "checkpoints" / latest / "meta.json").is_file()


def test_same_seed_same_weights_and_samples_dir_reuse(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "events.jsonl").write_text(dumps_many(list(generate(SyntheticConfig(n_users=80, n_items=60)).events())))
    a = run_train("--data", str(data), "--out", str(tmp_path / "a"), "--epochs", "1", "--seq-len", "10")
    b = run_train("--data", str(tmp_path / "a" / "samples"), "--out", str(tmp_path / "b"), "--epochs", "1")
    assert a["weights_sha256"] == b["weights_sha256"] and a["seq_len"] == 10


def test_bad_data_folder_is_a_clear_error(tmp_path):
    out = subprocess.run([sys.executable, "-m", "dinrec.cli.main", "train", "--data", str(tmp_path),
                          "--out", str(tmp_path / "o")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "layout not recognised" in out.stderr and "Traceback" not in out.stderr


def test_progress_goes_to_stderr_when_asked_and_stdout_is_the_result(tmp_path):
    """A pipe gets no progress by default (stderr is not a terminal here); DINREC_TRAIN_PROGRESS=true gives a
    line per stage and per epoch on stderr. Either way stdout is one JSON line: the result."""
    import os

    data = tmp_path / "data"
    data.mkdir()
    (data / "events.jsonl").write_text(dumps_many(list(generate(SyntheticConfig(n_users=80, n_items=60)).events())))
    runs = {}
    for name, env in (("quiet", {}), ("shown", {"DINREC_TRAIN_PROGRESS": "true"})):
        out = subprocess.run([sys.executable, "-m", "dinrec.cli.main", "train", "--data", str(data), "--out",
                              str(tmp_path / name), "--epochs", "2", "--seq-len", "10", "--recall-epochs", "2"],
                             cwd=REPO, capture_output=True, text=True, timeout=600,
                             env={**os.environ, **env, "DINREC_LOG_FORMAT": "text"})
        assert out.returncode == 0, out.stderr[-3000:]
        (line,) = out.stdout.strip().splitlines()
        runs[name] = (json.loads(line), out.stderr)
    assert runs["quiet"][0]["weights_sha256"] == runs["shown"][0]["weights_sha256"]
    assert "] samples:" not in runs["quiet"][1] and '"epoch": 1' not in runs["quiet"][1]
    shown = runs["shown"][1]
    for stage in ("] samples:", "] recall towers trained", "] co-visitation fitted", "] DIN trained: best epoch",
                  "] exported", "] the served list measured"):
        assert stage in shown, (stage, shown[-2000:])
    assert '"epoch": 1' in shown and '"epoch": 2' in shown  # a line per epoch
