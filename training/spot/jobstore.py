"""Where a spot job keeps its state: ``s3://bucket/prefix`` in production, a local folder for a
local run. Small JSON documents plus file uploads; S3 writes are single PUTs (atomic per object),
local writes go through a temp file and a rename, so a reader never sees half a document."""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from training.spot.aws import Aws, CloudError, call


class JobStore(ABC):
    uri: str

    @abstractmethod
    def put_bytes(self, key: str, data: bytes) -> None: ...

    @abstractmethod
    def get_bytes(self, key: str) -> bytes | None: ...

    @abstractmethod
    def keys(self, prefix: str) -> list[str]: ...

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

    def upload_dir(self, local: Path, key: str) -> None:
        for path in sorted(p for p in Path(local).rglob("*") if p.is_file()):
            self.put_bytes(f"{key}/{path.relative_to(local).as_posix()}", path.read_bytes())


class LocalJobStore(JobStore):
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.uri = str(self.root)

    def put_bytes(self, key: str, data: bytes) -> None:
        path = self.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def get_bytes(self, key: str) -> bytes | None:
        try:
            return (self.root / key).read_bytes()
        except FileNotFoundError:
            return None

    def keys(self, prefix: str) -> list[str]:
        base = self.root / prefix
        if not base.exists():
            return []
        return sorted(p.relative_to(self.root).as_posix() for p in base.rglob("*")
                      if p.is_file() and not p.name.startswith("."))


class S3JobStore(JobStore):
    def __init__(self, uri: str, aws: Aws) -> None:
        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        if not bucket:
            raise ValueError(f"not an S3 URI: {uri!r} (expected s3://bucket/prefix)")
        self.uri, self.bucket, self.prefix = uri.rstrip("/"), bucket, prefix.strip("/")
        self.s3 = aws.client("s3")

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

    def keys(self, prefix: str) -> list[str]:
        out: list[str] = []
        paginator = self.s3.get_paginator("list_objects_v2")
        strip = len(self.prefix) + 1 if self.prefix else 0
        pages = call(f"s3 list {self.child_uri(prefix)}", lambda: list(
            paginator.paginate(Bucket=self.bucket, Prefix=self._key(prefix))))
        for page in pages:
            out += [obj["Key"][strip:] for obj in page.get("Contents", [])]
        return sorted(out)


def open_job_store(uri: str, aws: Aws | None = None) -> JobStore:
    if uri.startswith("s3://"):
        if aws is None:
            raise ValueError("an s3:// job store needs AWS settings")
        return S3JobStore(uri, aws)
    if "://" in uri:
        raise ValueError(f"unsupported job store {uri!r}: use s3://bucket/prefix or a local folder")
    return LocalJobStore(uri)
