"""The one storage layer under checkpoints, spot job state and the registry: the same contract on a
folder and on S3 (boto3 against a real moto server)."""

from __future__ import annotations

import boto3
import pytest

from dinrec.storage import CloudError, LocalStorage, S3Storage, WriteConflict, open_storage


@pytest.fixture(params=["local", "s3"])
def storage(request, tmp_path):
    if request.param == "local":
        return open_storage(tmp_path / "store", durable=True)
    request.getfixturevalue("aws_env")
    bucket = request.getfixturevalue("unique")
    boto3.client("s3").create_bucket(Bucket=bucket)
    return open_storage(f"s3://{bucket}/some/prefix")


def test_keys_are_written_whole_listed_by_string_prefix_and_deleted(storage):
    assert storage.get_bytes("a/b.json") is None and not storage.exists("a/b.json") and storage.keys("a") == []
    storage.put_bytes("a/b.json", b"one")
    storage.put_bytes("a/b.json", b"two")  # replaced whole
    storage.put_json("a/c/d.json", {"x": 1})
    storage.put_bytes("ab", b"{not json")
    assert storage.get_bytes("a/b.json") == b"two" and storage.get_json("a/c/d.json") == {"x": 1}
    assert storage.keys("a/") == ["a/b.json", "a/c/d.json"]
    assert storage.keys("a") == ["a/b.json", "a/c/d.json", "ab"]  # a string prefix, as S3 lists
    assert storage.keys("a/c/d") == ["a/c/d.json"] and storage.exists("ab")
    storage.delete("a/c/d.json")
    storage.delete("a/c/d.json")  # absent: nothing
    assert storage.keys("a/") == ["a/b.json"]
    with pytest.raises(ValueError, match="not valid JSON"):
        storage.get_json("ab")


def test_a_conditional_write_lands_only_on_the_version_its_writer_read(storage):
    first = storage.put_if("doc.json", b"v1", None)  # None: create, only if absent
    with pytest.raises(WriteConflict):
        storage.put_if("doc.json", b"v1-again", None)
    read = storage.get_versioned("doc.json")
    assert read.data == b"v1" and read.version == first
    second = storage.put_if("doc.json", b"v2", read.version)
    assert second != first and storage.get_versioned("doc.json") == (b"v2", second)
    with pytest.raises(WriteConflict):  # a writer still holding the first read: refused, nothing written
        storage.put_if("doc.json", b"stale", read.version)
    assert storage.get_bytes("doc.json") == b"v2" and storage.keys("doc") == ["doc.json"]  # no lock file listed
    storage.delete("doc.json")
    with pytest.raises(WriteConflict):  # removed since it was read
        storage.put_if("doc.json", b"v3", second)
    assert storage.get_versioned("doc.json") is None


def test_of_many_local_writers_racing_from_one_read_exactly_one_wins(tmp_path):
    import threading

    storage = open_storage(tmp_path / "store")
    version = storage.put_if("doc", b"0", None)
    start = threading.Barrier(8)
    outcomes: list[int | None] = []

    def writer(n: int) -> None:
        start.wait()
        try:
            storage.put_if("doc", str(n).encode(), version)
            outcomes.append(n)
        except WriteConflict:
            outcomes.append(None)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(1, 9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [n for n in outcomes if n is not None]
    assert len(outcomes) == 8 and len(winners) == 1 and storage.get_bytes("doc") == str(winners[0]).encode()


def test_upload_dir_puts_the_commit_file_last(storage, tmp_path):
    src = tmp_path / "bundle"
    (src / "sub").mkdir(parents=True)
    for name in ("manifest.json", "a.bin", "sub/z.bin"):
        (src / name).write_bytes(name.encode())
    written: list[str] = []
    put = storage.put_bytes

    def put_recorded(key: str, data: bytes) -> None:
        written.append(key)
        put(key, data)

    storage.put_bytes = put_recorded
    storage.upload_dir(src, "v1", last="manifest.json")
    assert written[-1] == "v1/manifest.json" and sorted(written) == ["v1/a.bin", "v1/manifest.json", "v1/sub/z.bin"]
    assert storage.get_bytes("v1/sub/z.bin") == b"sub/z.bin"


def test_local_writes_leave_no_temp_files_and_no_empty_folders(tmp_path):
    s = LocalStorage(tmp_path, durable=True)
    s.put_bytes("x/y/z", b"1")
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == ["z"]
    s.delete("x/y/z")
    assert list(tmp_path.iterdir()) == []  # x/y removed with their last key


def test_s3_errors_are_mapped_once_at_the_boundary(aws_env):
    with pytest.raises(CloudError, match="s3 put s3://no-such-bucket-here/p/k"):
        S3Storage("s3://no-such-bucket-here/p").put_bytes("k", b"1")
    with pytest.raises(ValueError, match="expected s3://bucket/prefix"):
        S3Storage("s3://")
    with pytest.raises(ValueError, match="unsupported storage"):
        open_storage("gs://bucket/x")


def test_a_folder_is_written_whole_or_not_at_all(tmp_path):
    from dinrec.storage import folder_written_atomically, write_atomically

    target = tmp_path / "bundle"
    with folder_written_atomically(target) as tmp:
        (tmp / "a").write_text("1")
        assert not target.exists()  # nothing visible until the block ends
    assert (target / "a").read_text() == "1"
    with pytest.raises(RuntimeError), folder_written_atomically(target) as tmp:
        (tmp / "a").write_text("half")
        raise RuntimeError("died while writing")
    assert (target / "a").read_text() == "1"  # the old one stands
    with folder_written_atomically(target) as tmp:  # replace: the new one wins whole
        (tmp / "b").write_text("2")
    assert sorted(p.name for p in target.iterdir()) == ["b"]
    with folder_written_atomically(target, replace=False) as tmp:  # another writer got there first: keep theirs
        (tmp / "c").write_text("3")
    assert sorted(p.name for p in target.iterdir()) == ["b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]  # no temp folder left behind
    write_atomically(tmp_path / "f" / "x.json", b"{}", durable=True)
    assert (tmp_path / "f" / "x.json").read_bytes() == b"{}" and sorted(p.name for p in (tmp_path / "f").iterdir()) == [
        "x.json"]
