"""The experiments document on both storage backends (a folder; S3 through a real moto server): every
change a compare-and-swap, so of two writers exactly one lands and the other's change is refused whole."""

from __future__ import annotations

import uuid

import boto3
import pytest

from dinrec.experiments.document import DocumentConflict, ExperimentsDocument, split_location
from dinrec.experiments.spec import Experiment, Variant


@pytest.fixture(params=["folder", "s3"])
def location(request, tmp_path) -> str:
    if request.param == "folder":
        return str(tmp_path / "control" / "experiments.json")
    endpoint = request.getfixturevalue("aws_env")
    bucket = f"control-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    return f"s3://{bucket}/dinrec/experiments.json"


def exp(name: str, status: str = "draft") -> Experiment:
    return Experiment(name=name, status=status, variants=[Variant(name="a"), Variant(name="b")])


def adding(e: Experiment):
    return lambda exps: [*exps, e]


def test_changes_write_the_next_version_and_a_stale_one_is_refused(location):
    doc = ExperimentsDocument.open(location)
    assert doc.read() == (doc.read()[0], None) and doc.read()[0].version == 0  # nothing yet
    assert doc.update(adding(exp("one"))).version == 1
    with pytest.raises(DocumentConflict, match="at version 1, not 0") as info:
        doc.update(adding(exp("two")), expected=0)
    assert info.value.version == 1
    assert doc.update(adding(exp("two")), expected=1).version == 2
    read, _ = ExperimentsDocument.open(location).read()  # another process's view
    assert read.version == 2 and [e.name for e in read.experiments] == ["one", "two"]
    with pytest.raises(ValueError, match="distinct|unique|twice|duplicate"):  # refused by validation: nothing written
        doc.update(adding(exp("one")))
    assert doc.read()[0].version == 2


def test_a_writer_that_loses_the_race_writes_nothing(location, monkeypatch):
    doc, other = ExperimentsDocument.open(location), ExperimentsDocument.open(location)
    doc.update(adding(exp("base")))
    write = doc.storage.put_if

    def lose(key: str, data: bytes, version: str | None) -> str:  # the other writer lands in between
        monkeypatch.setattr(doc.storage, "put_if", write)
        other.update(adding(exp("theirs", "running")))
        return write(key, data, version)

    monkeypatch.setattr(doc.storage, "put_if", lose)
    with pytest.raises(DocumentConflict, match="changed while this change was made") as info:
        doc.update(adding(exp("mine")))
    assert info.value.version == 2
    assert [e.name for e in doc.read()[0].experiments] == ["base", "theirs"]


def test_the_retrain_rollout_redoes_its_change_on_top_of_an_admin_change(tmp_path, monkeypatch):
    from dinrec.retrain.rollout import start_challenger_experiment
    from dinrec.retrain.settings import RetrainSettings

    path = tmp_path / "experiments.json"
    doc, admin = ExperimentsDocument.open(path), ExperimentsDocument.open(path)
    doc.update(adding(exp("admins")))
    settings = RetrainSettings(registry=str(tmp_path / "registry"), rollout="challenger", experiments_file=path)
    read = ExperimentsDocument.read
    raced: list[bool] = []

    def admin_writes_after_the_first_read(self):
        found = read(self)
        if not raced:
            raced.append(True)
            admin.update(adding(exp("admins-2")))
        return found

    with monkeypatch.context() as patched:
        patched.setattr(ExperimentsDocument, "read", admin_writes_after_the_first_read)
        name = start_challenger_experiment(settings, "v7")
    final, _ = doc.read()
    assert raced and name == "retrain-v7"
    assert [e.name for e in final.experiments] == ["admins", "admins-2", "retrain-v7"] and final.version == 3
    assert start_challenger_experiment(settings, "v7") == name and doc.read()[0].version == 3  # resumed: as is


def test_locations_name_a_document():
    assert split_location("/etc/dinrec/experiments.json") == ("/etc/dinrec", "experiments.json")
    assert split_location("experiments.json") == (".", "experiments.json")
    assert split_location("s3://bucket/a/x.json") == ("s3://bucket/a", "x.json")
    with pytest.raises(ValueError, match="name a file"):
        split_location("s3://bucket")
