"""One storage layer: a local folder or an S3 prefix, keys → bytes.

The event archive (feature_store.archive), checkpoints (training.checkpoint), spot job state
(training.spot) and the model registry (training.registry) all sit on it, so each gets the same two
guarantees on both backends:

* **a key is written whole or not at all** — an S3 PUT is atomic per object; locally the bytes go
  to a temp file (fsynced, with its folder, when ``durable``) that is renamed over the key;
* **a reader never trusts a half-written group** — a multi-key thing (a checkpoint, a bundle
  version) writes its index key last (``meta.json``, ``manifest.json``) and exists only once that
  key does; a pointer (``latest``, an alias) is one key, moved atomically.

AWS errors are mapped once, here (:func:`call` → :class:`CloudError`, which training.spot's AWS
boundary uses too); a missing key reads as None.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class CloudError(RuntimeError):
    """An AWS call failed; the message says which call and why."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


def call(what: str, fn: Callable[..., T], /, **kwargs: Any) -> T:
    """``fn(**kwargs)``, with botocore's errors turned into one :class:`CloudError` naming ``what``."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return fn(**kwargs)
    except ClientError as exc:
        err = exc.response.get("Error", {})
        raise CloudError(f"{what}: {err.get('Code', 'error')}: {err.get('Message', exc)}", err.get("Code")) from exc
    except BotoCoreError as exc:  # no credentials, endpoint unreachable, bad region, …
        raise CloudError(f"{what}: {exc}") from exc


def reraise_as(error: type[Exception], where: str, what: str, fn: Callable, *args: Any) -> Any:
    """``fn(*args)``, its :class:`CloudError` raised again as ``error`` ("where: what: why"): how a
    package maps the storage layer's one error type to its own."""
    try:
        return fn(*args)
    except CloudError as exc:
        raise error(f"{where}: {what}: {exc}") from exc


def aws_client(service: str, region: str | None = None, endpoint_url: str | None = None) -> Any:
    """A boto3 client with bounded retries and timeouts, the one way dinrec makes them (region and
    endpoint: boto3's environment unless given — AWS_ENDPOINT_URL points it at moto in tests)."""
    import boto3
    from botocore.config import Config

    region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    return boto3.client(service, region_name=region, endpoint_url=endpoint_url,
                        config=Config(retries={"max_attempts": 5, "mode": "standard"}, connect_timeout=5,
                                      read_timeout=30))


def s3_client(region: str | None = None, endpoint_url: str | None = None) -> Any:
    return aws_client("s3", region, endpoint_url)


class Storage(ABC):
    uri: str

    @abstractmethod
    def put_bytes(self, key: str, data: bytes) -> None:
        """Write ``key`` atomically (replacing it)."""

    @abstractmethod
    def get_bytes(self, key: str) -> bytes | None:
        """The bytes of ``key``, or None if there is no such key."""

    @abstractmethod
    def keys(self, prefix: str) -> list[str]:
        """Every key starting with ``prefix`` (a string prefix, as S3 lists), sorted."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key`` (nothing if absent)."""

    def exists(self, key: str) -> bool:
        return self.get_bytes(key) is not None

    def child_uri(self, key: str) -> str:
        return f"{self.uri.rstrip('/')}/{key}"

    def put_json(self, key: str, doc: Any) -> None:
        self.put_bytes(key, json.dumps(doc, indent=1, sort_keys=True, default=str).encode())

    def get_json(self, key: str) -> Any | None:
        data = self.get_bytes(key)
        if data is None:
            return None
        try:
            return json.loads(data)
        except ValueError as exc:
            raise ValueError(f"{self.child_uri(key)} is not valid JSON: {exc}") from exc

    def upload_dir(self, local: Path, key: str, last: str | None = None) -> None:
        """Every file under ``local`` to ``key/…``; the file named ``last`` goes last (the commit point)."""
        files = sorted((p for p in Path(local).rglob("*") if p.is_file()), key=lambda p: (p.name == last, str(p)))
        for path in files:
            self.put_bytes(f"{key}/{path.relative_to(local).as_posix()}", path.read_bytes())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes, durable: bool = False) -> None:
    """Replace ``path`` with ``data`` so that a reader sees the old file or the new one, never half of
    one (a temp file beside it, then a rename). ``durable``: fsync the file and its folder as well, so
    the write survives a machine crash, not only a process crash. The one write-then-rename of files."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with tmp.open("wb") as fh:
        fh.write(data)
        if durable:
            fh.flush()
            os.fsync(fh.fileno())
    os.replace(tmp, path)
    if durable:
        _fsync_dir(path.parent)


@contextmanager
def folder_written_atomically(target: Path, replace: bool = True) -> Iterator[Path]:
    """An empty temp folder beside ``target`` to fill; when the block ends without an error it is
    renamed into place, so ``target`` is whole or absent, never half written. ``replace``: an existing
    ``target`` is removed first; otherwise one another writer renamed there first is kept (theirs is
    the same immutable thing). On an error the temp folder is removed. The one write-then-rename of
    folders (bundles, samples, cached and fetched versions)."""
    target = Path(target)
    tmp = target.parent / f".tmp-{target.name}-{os.getpid()}-{time.time_ns()}"
    tmp.mkdir(parents=True)
    try:
        yield tmp
        if replace and target.exists():
            shutil.rmtree(target)
        try:
            tmp.rename(target)
        except OSError:
            if replace or not target.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class LocalStorage(Storage):
    """A folder. ``durable``: fsync each file and its folder before and after the rename, so a written
    key survives a machine crash, not only a process crash (checkpoints ask for it)."""

    def __init__(self, root: str | Path, durable: bool = False) -> None:
        self.root, self.durable = Path(root), durable
        self.uri = str(self.root)

    def put_bytes(self, key: str, data: bytes) -> None:
        write_atomically(self.root / key, data, self.durable)

    def get_bytes(self, key: str) -> bytes | None:
        try:
            return (self.root / key).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def keys(self, prefix: str) -> list[str]:
        folder = self.root / prefix.rpartition("/")[0]  # the deepest folder the prefix names whole
        if not folder.is_dir():
            return []
        return sorted(k for k in (p.relative_to(self.root).as_posix() for p in folder.rglob("*")
                                  if p.is_file() and not p.name.startswith("."))
                      if k.startswith(prefix))

    def delete(self, key: str) -> None:
        path = self.root / key
        path.unlink(missing_ok=True)
        parent = path.parent
        while parent != self.root and parent.is_dir() and not any(parent.iterdir()):  # no empty folders left
            parent.rmdir()
            parent = parent.parent


class S3Storage(Storage):
    """``s3://bucket/prefix``; endpoint and credentials as boto3 reads them (AWS_ENDPOINT_URL: moto in
    tests) unless ``client`` (a boto3 S3 client) says otherwise."""

    def __init__(self, uri: str, client: Any = None) -> None:
        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        if not uri.startswith("s3://") or not bucket:
            raise ValueError(f"not an S3 URI: {uri!r} (expected s3://bucket/prefix)")
        self.uri, self.bucket, self.prefix = uri.rstrip("/"), bucket, prefix.strip("/")
        self.s3 = client or s3_client()

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def put_bytes(self, key: str, data: bytes) -> None:
        call(f"s3 put {self.child_uri(key)}", self.s3.put_object, Bucket=self.bucket, Key=self._key(key), Body=data)

    def get_bytes(self, key: str) -> bytes | None:
        try:
            resp = call(f"s3 get {self.child_uri(key)}", self.s3.get_object, Bucket=self.bucket, Key=self._key(key))
        except CloudError as exc:
            if exc.code in ("NoSuchKey", "404"):
                return None
            raise
        return resp["Body"].read()

    def exists(self, key: str) -> bool:
        try:
            call(f"s3 head {self.child_uri(key)}", self.s3.head_object, Bucket=self.bucket, Key=self._key(key))
        except CloudError as exc:
            if exc.code in ("NoSuchKey", "404"):
                return False
            raise
        return True

    def keys(self, prefix: str) -> list[str]:
        paginator = self.s3.get_paginator("list_objects_v2")
        strip = len(self.prefix) + 1 if self.prefix else 0
        pages = call(f"s3 list {self.child_uri(prefix)}", lambda: list(
            paginator.paginate(Bucket=self.bucket, Prefix=self._key(prefix))))
        return sorted(obj["Key"][strip:] for page in pages for obj in page.get("Contents", []))

    def delete(self, key: str) -> None:
        call(f"s3 delete {self.child_uri(key)}", self.s3.delete_object, Bucket=self.bucket, Key=self._key(key))


def open_storage(uri: str | Path, client: Any = None, durable: bool = False) -> Storage:
    """A local folder, or ``s3://bucket/prefix`` (``client``: a boto3 S3 client to use)."""
    text = str(uri)
    if text.startswith("s3://"):
        return S3Storage(text, client)
    if "://" in text:
        raise ValueError(f"unsupported storage {text!r}: use a folder or s3://bucket/prefix")
    return LocalStorage(text, durable=durable)
