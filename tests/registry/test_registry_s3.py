"""The registry on S3 (a real moto server over HTTP): versions appear only once their manifest is up,
aliases move by one PUT, a reader gets a verified local copy, and a service reloads when the alias moves."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import boto3
import pytest
import torch

from dinrec.models.bundle import load_bundle
from dinrec.models.ranking import Recommender
from dinrec.registry.store import RegistryError, S3Registry, open_registry
from dinrec.serving.models import ModelManager
from dinrec.serving.settings import ServingSettings
from dinrec.training.export import export_bundle
from tests.conftest import REPO


@pytest.fixture
def s3_registry(aws_env, tmp_path) -> S3Registry:
    bucket = f"models-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=aws_env, region_name="us-east-1").create_bucket(Bucket=bucket)
    reg = open_registry(f"s3://{bucket}/dinrec/registry", cache_dir=tmp_path / "cache")
    assert isinstance(reg, S3Registry)
    return reg


def _second_bundle(tiny_run, tmp_path):
    _, samples, bundle_dir, metrics = tiny_run
    v1 = load_bundle(bundle_dir)
    assert v1.covisit is not None
    model = v1.model
    with torch.no_grad():  # a different model: its scores and version differ
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return export_bundle(tmp_path / "v2-build", model, samples, metrics, towers=v1.towers, lane=(v1.covisit, {}))


def test_publish_alias_resolve_and_a_verified_local_copy(s3_registry, tiny_run, tmp_path):
    bundle_dir = tiny_run[2]
    assert s3_registry.publish(bundle_dir, "v1") == "v1"
    with pytest.raises(RegistryError, match="immutable"):
        s3_registry.publish(bundle_dir, "v1")
    with pytest.raises(RegistryError, match="no version v9"):
        s3_registry.set_alias("champion", "v9")
    with pytest.raises(RegistryError, match="not set"):
        s3_registry.resolve("champion")
    s3_registry.set_alias("champion", "v1")
    assert s3_registry.resolve("champion") == "v1" and s3_registry.aliases() == {"champion": "v1"}
    assert s3_registry.versions() == ["v1"]
    assert s3_registry.publish(bundle_dir, "v2") == "v2"
    s3_registry.set_alias("champion", "v2", reason="promote")
    assert s3_registry.rollback("champion") == "v1" and s3_registry.resolve("champion") == "v1"
    assert [(h["version"], h["previous"]) for h in s3_registry.history("champion")] == [
        ("v1", None), ("v2", "v1"), ("v1", "v2")]
    assert s3_registry.aliases() == {"champion": "v1"}  # history is not an alias
    # A gate's evaluation lies beside the version, one record per run (a rerun rewrites its own).
    assert s3_registry.evaluations("v2") == []
    s3_registry.record_evaluation("v2", "r2", {"run": "r2", "served_hr": 0.2})
    s3_registry.record_evaluation("v2", "r1", {"run": "r1", "served_hr": 0.0})
    s3_registry.record_evaluation("v2", "r1", {"run": "r1", "served_hr": 0.1})
    assert s3_registry.evaluations("v2") == [{"run": "r1", "served_hr": 0.1}, {"run": "r2", "served_hr": 0.2}]
    with pytest.raises(RegistryError, match="no version v9"):
        s3_registry.record_evaluation("v9", "r1", {})
    with pytest.raises(RegistryError, match="use letters"):
        s3_registry.record_evaluation("v2", "../r", {})
    assert s3_registry.versions() == ["v1", "v2"]  # evaluations are not versions

    local = s3_registry.bundle_dir("v1")
    assert local.parent == tmp_path / "cache"
    assert sorted(p.name for p in local.iterdir()) == sorted(p.name for p in bundle_dir.iterdir())
    assert load_bundle(local).model_version == load_bundle(bundle_dir).model_version
    assert s3_registry.manifest("v1")["model_version"] == load_bundle(bundle_dir).model_version


def test_a_half_uploaded_version_does_not_exist_and_a_corrupt_one_is_refused(s3_registry, tiny_run):
    bundle_dir = tiny_run[2]
    s3 = s3_registry.storage.s3
    # An upload cut off before its manifest: everything but manifest.json.
    for path in sorted(p for p in bundle_dir.iterdir() if p.name != "manifest.json"):
        s3.put_object(Bucket=s3_registry.storage.bucket, Key=f"{s3_registry.storage.prefix}/bundles/v1/{path.name}",
                      Body=path.read_bytes())
    assert s3_registry.versions() == []
    with pytest.raises(RegistryError, match="no version v1"):
        s3_registry.set_alias("champion", "v1")
    with pytest.raises(RegistryError, match="no version v1"):
        s3_registry.bundle_dir("v1")

    s3_registry.publish(bundle_dir, "v2")
    weights = f"{s3_registry.storage.prefix}/bundles/v2/model.safetensors"
    body = bytearray(s3.get_object(Bucket=s3_registry.storage.bucket, Key=weights)["Body"].read())
    body[-1] ^= 0xFF  # one flipped bit in the weights
    s3.put_object(Bucket=s3_registry.storage.bucket, Key=weights, Body=bytes(body))
    with pytest.raises(RegistryError, match="does not verify"):
        s3_registry.bundle_dir("v2")
    assert not (s3_registry.cache / "v2").exists()  # nothing half-verified is left to be served


def test_a_service_serves_the_alias_from_s3_and_follows_it(s3_registry, tiny_run, tmp_path):
    s3_registry.publish(tiny_run[2], "v1")
    s3_registry.publish(_second_bundle(tiny_run, tmp_path), "v2")
    s3_registry.set_alias("champion", "v1")
    settings = ServingSettings(registry=s3_registry.uri, registry_cache=tmp_path / "service-cache",
                               score_precision="fp32")
    swaps: list[Recommender] = []
    manager = ModelManager(settings, on_swap=swaps.append)
    assert manager.version == "v1" and manager.current is not None
    first = manager.current.model_version
    s3_registry.set_alias("champion", "v2")
    assert manager.reload() is True and manager.version == "v2"
    assert swaps and swaps[-1].model_version != first
    assert (tmp_path / "service-cache" / "v2").is_dir()  # downloaded into the service's cache
    assert manager.reload() is False  # the alias has not moved since


def test_the_cli_publishes_and_lists_an_s3_registry(s3_registry, tiny_run, aws_env):
    env_cmd = [sys.executable, "-m", "dinrec.cli.main", "models"]
    out = subprocess.run([*env_cmd, "publish", str(tiny_run[2]), "--registry", s3_registry.uri, "--version", "v1",
                          "--alias", "champion"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout)["registry"] == s3_registry.uri
    listed = subprocess.run([*env_cmd, "list", "--registry", s3_registry.uri], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert json.loads(listed.stdout)["aliases"] == {"champion": "v1"}


def test_keys_outside_the_manifest_are_never_written_and_a_climbing_manifest_is_refused(s3_registry, tiny_run,
                                                                                         tmp_path):
    s3, bucket, prefix = s3_registry.storage.s3, s3_registry.storage.bucket, s3_registry.storage.prefix
    outside = tmp_path / "outside.txt"
    s3_registry.publish(tiny_run[2], "v1")
    # A registry writer adds keys that a naive download would write outside the cache (S3 allows both).
    for key in (f"bundles/v1//{outside}", "bundles/v1/../../outside.txt", "bundles/v1/item_index.extra"):
        s3.put_object(Bucket=bucket, Key=f"{prefix}/{key}", Body=b"planted")
    local = s3_registry.bundle_dir("v1")
    assert not outside.exists() and not (tmp_path / "cache" / "outside.txt").exists()
    assert sorted(p.name for p in local.iterdir()) == sorted(p.name for p in tiny_run[2].iterdir())
    assert load_bundle(local).model_version

    # A manifest that names a file outside the bundle: refused before anything is fetched.
    manifest = json.loads((tiny_run[2] / "manifest.json").read_text())
    manifest["files"]["../../escape.txt"] = "0" * 64
    s3_registry.publish(tiny_run[2], "v2")
    s3.put_object(Bucket=bucket, Key=f"{prefix}/bundles/v2/manifest.json", Body=json.dumps(manifest).encode())
    with pytest.raises(RegistryError, match="not a plain file name"):
        s3_registry.bundle_dir("v2")
    assert not (s3_registry.cache / "v2").exists() and not (tmp_path / "escape.txt").exists()
