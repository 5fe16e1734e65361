"""Alias moves are compare-and-swap, in a folder and on S3 (a real moto server): of two movers racing
exactly one lands, and a mover that names the version it expects moves nothing when it is wrong."""

from __future__ import annotations

import uuid

import boto3
import pytest

from dinrec.registry.store import AliasConflict, open_registry


@pytest.fixture(params=["folder", "s3"])
def registry(request, tmp_path, tiny_run):
    if request.param == "folder":
        reg = open_registry(tmp_path / "registry")
    else:
        endpoint = request.getfixturevalue("aws_env")
        bucket = f"models-{uuid.uuid4().hex[:8]}"
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
        reg = open_registry(f"s3://{bucket}/registry", cache_dir=tmp_path / "cache")
    for version in ("v1", "v2", "v3"):
        reg.publish(tiny_run[2], version)
    return reg


def test_a_mover_that_expects_another_version_moves_nothing(registry):
    registry.set_alias("champion", "v1", expected=None)  # None: only if unset
    with pytest.raises(AliasConflict, match="holds v1, not nothing"):
        registry.set_alias("champion", "v2", expected=None)
    with pytest.raises(AliasConflict, match="holds v1, not v3"):  # the retrain gated against v3: stale
        registry.set_alias("champion", "v2", expected="v3")
    assert registry.resolve("champion") == "v1"
    registry.set_alias("champion", "v2", expected="v1")
    assert registry.resolve("champion") == "v2"
    assert [h["version"] for h in registry.history("champion")] == ["v1", "v2"]  # refused moves left no record


def test_of_two_moves_racing_exactly_one_lands(registry):
    """A second mover (its own registry object on the same storage) moves the alias between the first one's
    read and its write — a real interleaving on the real storage: the first is refused, nothing it wrote
    moved the alias, and the alias holds the second's version."""
    registry.set_alias("champion", "v1")
    storage = registry.storage
    other = open_registry(storage.uri, cache_dir=getattr(registry, "cache", None))
    write = storage.put_if

    def lose_the_race(key: str, data: bytes, version: str | None) -> str:
        storage.put_if = write  # once
        other.set_alias("champion", "v3", reason="the other mover")
        return write(key, data, version)

    storage.put_if = lose_the_race
    with pytest.raises(AliasConflict, match="moved while it was being moved to v2"):
        registry.set_alias("champion", "v2")
    assert registry.resolve("champion") == "v3"


def test_a_rollback_racing_a_move_rolls_back_nothing(registry):
    registry.set_alias("champion", "v1")
    registry.set_alias("champion", "v2")
    resolve = registry.resolve

    def moved_meanwhile(alias: str) -> str:
        registry.resolve = resolve  # once
        current = resolve(alias)
        registry.set_alias("champion", "v3", reason="promoted meanwhile")
        return current

    registry.resolve = moved_meanwhile
    with pytest.raises(AliasConflict, match="holds v3, not v2"):
        registry.rollback("champion")  # decided to go back from v2: wrong once v3 is the champion
    assert registry.resolve("champion") == "v3"
