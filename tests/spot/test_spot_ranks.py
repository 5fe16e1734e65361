"""A spot job runs as the plan says: one training rank per GPU (here two CPU ranks on gloo) with DIN's
tables sharded by TorchRec. An interruption notice stops every rank after a checkpoint — the job's
launcher reports it as interrupted (exit 75), not failed — and the relaunched attempt resumes the sharded
checkpoint to the weights an uninterrupted run ends with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dinrec.training.launch import exit_code, parse_ranks, without_ranks
from dinrec.training.sharded import torchrec_missing
from tests.conftest import REPO, free_port, synthetic_dataset_dir

TRAIN = ["--epochs", "4", "--batch-size", "128", "--seq-len", "20", "--checkpoint-every", "5"]
ENV = {"DINREC_TRAIN_OBJECTIVE": "pointwise",  # sharded tables train the pointwise objective
       "DINREC_TRAIN_THREADS": "1", "DINREC_TRAIN_RECALL_EPOCHS": "0", "DINREC_TRAIN_RANKING_BLEND": "false",
       "DINREC_TRAIN_DEVICE": "cpu"}


def _dinrec(*args: str, env: dict, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dinrec.cli.main", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.skipif(torchrec_missing() is not None, reason=str(torchrec_missing()))
def test_a_two_rank_sharded_spot_job_is_interrupted_and_resumes_to_the_uninterrupted_weights(
        metadata_mock, tmp_path):
    data = synthetic_dataset_dir(tmp_path / "data", n_users=300, n_items=150, n_categories=8,
                                 mean_events_per_user=30, seed=6)
    env = {**os.environ, **ENV}
    reference = _dinrec("train", "--data", str(data), "--out", str(tmp_path / "ref"), "--no-progress",
                        "--ranks", "2", "--embeddings", "sharded", *TRAIN, env=env)
    assert reference.returncode == 0, reference.stderr[-3000:]
    whole = json.loads(reference.stdout.strip().splitlines()[-1])
    assert whole["world_size"] == 2 and whole["embeddings"] == "sharded"

    state = tmp_path / "state"
    interrupting_port = free_port()  # attempt 1's metadata service: announces the interruption once training runs
    calm = metadata_mock("events")

    def announce_when_training() -> None:
        deadline = time.monotonic() + 600
        while not list(state.glob("jobs/*/checkpoints/latest")) and time.monotonic() < deadline:
            time.sleep(0.05)
        metadata_mock("spot", "--mock-delay-sec", "0", port=interrupting_port)

    threading.Thread(target=announce_when_training, daemon=True).start()
    job_env = {**env, "DINREC_SPOT_STATE_URI": str(state), "DINREC_SPOT_BACKEND": "local",
               "DINREC_SPOT_WORKDIR": str(tmp_path / "work"), "DINREC_SPOT_POLL_S": "0.3",
               "DINREC_SPOT_IMDS_POLL_S": "0.2", "DINREC_SPOT_RESULTS_KEY": "q" * 64}
    run = _dinrec("spot", "run", "--data", str(data), "--instance-type", "g5.xlarge", "--ranks", "2",
                  "--embeddings", "sharded", "--train-args", " ".join(TRAIN),
                  "--imds-url", f"http://127.0.0.1:{interrupting_port}", "--imds-url", calm, env=job_env)
    logs = "\n".join(p.read_text()[-3000:] for p in (tmp_path / "work").glob("*/*/log.txt"))
    assert run.returncode == 0, run.stderr[-3000:] + logs
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["status"] == "done" and report["attempts"] == 2 and report["interruptions"] == 1, report + logs
    job = next((state / "jobs").iterdir())
    first = json.loads((job / "attempts" / "1" / "status.json").read_text())
    assert first["state"] == "interrupted" and first["exit_code"] == 75 and "notice" in first
    shards = sorted(p.name for p in (job / "checkpoints").glob("step-*/shard-*.pt"))
    assert {"shard-00000.pt", "shard-00001.pt"} <= set(shards)  # both ranks' rows were checkpointed
    # attempt 2 ran both ranks from the sharded checkpoint to the same end as the uninterrupted run
    resumed = [json.loads(line) for line in
               (tmp_path / "work" / job.name / "attempt-2" / "log.txt").read_text().splitlines()
               if line.startswith("{") and "weights_sha256" in line]
    assert resumed and resumed[-1]["weights_sha256"] == whole["weights_sha256"]
    assert resumed[-1]["world_size"] == 2 and resumed[-1]["resumed_from"] is not None


def test_the_launcher_passes_every_other_flag_to_the_ranks_and_reads_their_exit_codes():
    from types import SimpleNamespace as F

    assert without_ranks(["--data", "d", "--ranks", "2", "--epochs", "1", "--ranks=gpus"]) == \
        ["--data", "d", "--epochs", "1"]
    assert exit_code({0: F(exitcode=75), 1: F(exitcode=75)}) == 75  # stopped after a checkpoint
    assert exit_code({0: F(exitcode=75), 1: F(exitcode=-15)}) == 75  # one finished stopping on the launcher's TERM
    assert exit_code({0: F(exitcode=75), 1: F(exitcode=1)}) == 1  # a rank failed: the job failed
    assert exit_code({1: F(exitcode=-9)}) == 1  # killed (out of memory): failed, not interrupted
    assert exit_code({1: F(exitcode=2)}) == 2  # bad input keeps its code
    assert parse_ranks("3") == 3 and parse_ranks("gpus") >= 1
    for bad in ("0", "zero", "-1", "2000"):
        with pytest.raises(ValueError, match="--ranks"):
            parse_ranks(bad)


def test_candidates_with_different_gpu_counts_are_refused_for_one_rank_per_gpu(tmp_path):
    from dinrec.spot.wiring import same_rank_count

    same_rank_count(["g4dn.12xlarge", "g5.12xlarge"], "gpus")  # four GPUs each
    same_rank_count(["g4dn.xlarge", "g4dn.12xlarge"], "2")  # a fixed count runs anywhere
    with pytest.raises(ValueError, match="different GPU counts"):
        same_rank_count(["g4dn.xlarge", "g4dn.12xlarge"], "gpus")


def test_the_plan_decides_the_tables_and_keeps_candidates_on_one_gpu_count():
    from dinrec.spot.catalog import load_catalog
    from dinrec.spot.cli import _types_from_plan

    plans = REPO / "deploy" / "plans"
    catalog = {t.name: t for t in load_catalog()}
    big, how = _types_from_plan(plans / "taobao-200m-rows.json", load_catalog())
    assert how == "sharded" and big[0] == "g4dn.12xlarge" and len({catalog[t].gpus for t in big}) == 1
    small, how = _types_from_plan(plans / "movielens.json", load_catalog())
    assert how == "replicated"  # sharding saves nothing on a 1,683-row table: no TorchRec needed
    assert all(catalog[t].gpus == 1 for t in small)


def test_a_job_spec_refuses_a_bad_rank_count():
    from pydantic import ValidationError

    from dinrec.spot.job import JobSpec, boot_script

    with pytest.raises(ValidationError):
        JobSpec(job_id="j", job_uri="/tmp/j", backend="local", instance_types=["g5.xlarge"], ranks="0; rm -rf /")
    spec = JobSpec(job_id="j", job_uri="/tmp/j", backend="local", instance_types=["g5.xlarge"], embeddings="sharded")
    assert "--ranks gpus --embeddings sharded" in boot_script(spec, 1)


def test_resume_on_a_different_rank_count_is_a_clear_error(tmp_path: Path):
    """(What the GPU-count rule above prevents, as the trainer reports it.)"""
    data = synthetic_dataset_dir(tmp_path / "data", n_users=60, n_items=40, n_categories=4,
                                 mean_events_per_user=10, seed=2)
    env = {**os.environ, **ENV}
    first = _dinrec("train", "--data", str(data), "--out", str(tmp_path / "o"), "--no-progress", "--epochs", "1",
                    "--batch-size", "64", env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    again = _dinrec("train", "--data", str(tmp_path / "o" / "samples"), "--out", str(tmp_path / "o"),
                    "--no-progress", "--epochs", "2", "--batch-size", "64", "--resume", "auto", "--ranks", "2",
                    env=env)
    assert again.returncode != 0 and "ranks" in again.stderr
