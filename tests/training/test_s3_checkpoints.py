"""Checkpoints in S3 (boto3 against a real moto server): same contract as the local store."""

from __future__ import annotations

import boto3
import pytest

from dinrec.datasets.synthetic import SyntheticConfig, generate
from dinrec.storage import S3Storage
from dinrec.training.checkpoint import CheckpointError, open_checkpoint_store
from dinrec.training.loop import TrainingInterrupted
from dinrec.training.run import train
from dinrec.training.samples import build_samples
from tests.training.test_resume import StopAfter, settings


@pytest.fixture
def bucket(aws_env, unique):
    boto3.client("s3").create_bucket(Bucket=unique)
    return unique


def test_spot_style_interrupt_checkpoints_to_s3_and_resumes_exactly(bucket):
    samples = build_samples(generate(SyntheticConfig(n_users=100, n_items=80, n_categories=6, seed=4)), seq_len=10)
    full = train(samples, settings(epochs=2))
    store = open_checkpoint_store(f"s3://{bucket}/jobs/j1", keep=2)
    assert isinstance(store.storage, S3Storage)
    with pytest.raises(TrainingInterrupted):
        train(samples, settings(epochs=2), checkpoints=store, stop=StopAfter(9))
    assert store.latest() == "step-000000010"
    # a fresh process (a relaunched instance) sees only what is in the bucket
    resumed = train(samples, settings(epochs=2), checkpoints=open_checkpoint_store(f"s3://{bucket}/jobs/j1", keep=2),
                    resume="auto")
    assert resumed.metrics["weights_sha256"] == full.metrics["weights_sha256"]
    keys = {o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=bucket)["Contents"]}
    assert "jobs/j1/latest" in keys and len(store.names()) <= 2


def test_incomplete_s3_checkpoints_are_ignored_and_errors_are_ours(bucket):
    s3 = boto3.client("s3")
    store = open_checkpoint_store(f"s3://{bucket}/p")
    assert store.latest() is None
    store.save("step-000000001", {"x": 1}, {"note": "ok"})
    s3.put_object(Bucket=bucket, Key="p/step-000000002/state.pt", Body=b"half written")  # no meta.json
    assert store.names() == ["step-000000001"] and store.latest() == "step-000000001"
    state, meta = store.load("step-000000001")
    assert state == {"x": 1} and meta["note"] == "ok"
    with pytest.raises(CheckpointError, match="missing or incomplete"):
        store.load("step-000000002")
    with pytest.raises(CheckpointError):
        open_checkpoint_store("s3://no-such-bucket-here/p").names()
