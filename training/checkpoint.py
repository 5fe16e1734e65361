"""Spot-safe training checkpoints, in a local directory or in S3 (by URI).

A checkpoint is a folder ``step-000001234/`` holding ``state.pt`` (tensors and plain values only:
model, optimiser, schedule, grad scaler, every RNG, the data position, the best metric) and
``meta.json`` (format version, config, code version, dataset fingerprint). It is *complete* once
``meta.json`` exists, which is written last:

* local: files go to a temp folder, are fsynced, the folder is renamed into place and fsynced,
  then the ``latest`` pointer file is replaced atomically (temp file + rename);
* S3: ``state.pt`` is put first, ``meta.json`` second, then the ``latest`` object; a reader
  trusts only checkpoints whose ``meta.json`` it can read.

The newest ``keep`` checkpoints are kept. ``state.pt`` is read with ``torch.load(weights_only=True)``,
so a checkpoint can never execute code.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from abc import ABC, abstractmethod
from pathlib import Path

import torch

CHECKPOINT_FORMAT = "dinrec-checkpoint"
CHECKPOINT_FORMAT_VERSION = 1
LATEST = "latest"


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete, of an unknown version, or belongs to other data/config."""


def checkpoint_name(global_step: int) -> str:
    return f"step-{global_step:09d}"


class CheckpointStore(ABC):
    """Where checkpoints live. ``save`` is atomic; ``latest`` names the newest complete one."""

    def __init__(self, keep: int = 3) -> None:
        if keep < 1:
            raise ValueError("keep must be >= 1")
        self.keep = keep

    def save(self, name: str, state: dict, meta: dict) -> None:
        buf = io.BytesIO()
        torch.save(state, buf)
        meta = {"format": CHECKPOINT_FORMAT, "format_version": CHECKPOINT_FORMAT_VERSION, **meta}
        self._write(name, buf.getvalue(), json.dumps(meta, indent=1, default=str).encode())
        self._set_latest(name)
        for old in self.names()[:-self.keep]:
            self._delete(old)

    def load(self, name: str) -> tuple[dict, dict]:
        state_bytes, meta_bytes = self._read(name)
        meta = json.loads(meta_bytes)
        if meta.get("format") != CHECKPOINT_FORMAT or meta.get("format_version") != CHECKPOINT_FORMAT_VERSION:
            raise CheckpointError(f"checkpoint {name}: unknown format {meta.get('format')!r} "
                                  f"version {meta.get('format_version')!r}")
        try:
            state = torch.load(io.BytesIO(state_bytes), map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - torch raises UnpicklingError, RuntimeError, EOFError…
            raise CheckpointError(f"checkpoint {name}: state.pt cannot be loaded safely: {exc}") from exc
        return state, meta

    def latest(self) -> str | None:
        """The newest complete checkpoint: the pointer if it names one, else the newest on disk."""
        names = self.names()
        pointed = self._get_latest()
        if pointed in names:
            return pointed
        return names[-1] if names else None

    @abstractmethod
    def names(self) -> list[str]:
        """Complete checkpoints, oldest first."""

    @abstractmethod
    def _write(self, name: str, state: bytes, meta: bytes) -> None: ...

    @abstractmethod
    def _read(self, name: str) -> tuple[bytes, bytes]: ...

    @abstractmethod
    def _delete(self, name: str) -> None: ...

    @abstractmethod
    def _set_latest(self, name: str) -> None: ...

    @abstractmethod
    def _get_latest(self) -> str | None: ...


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalCheckpointStore(CheckpointStore):
    def __init__(self, root: str | Path, keep: int = 3) -> None:
        super().__init__(keep)
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def names(self) -> list[str]:
        return sorted(p.name for p in self.root.glob("step-*") if (p / "meta.json").is_file())

    def _write(self, name: str, state: bytes, meta: bytes) -> None:
        tmp = self.root / f".tmp-{name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for fname, data in (("state.pt", state), ("meta.json", meta)):
            with (tmp / fname).open("wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        _fsync_dir(tmp)
        final = self.root / name
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        _fsync_dir(self.root)

    def _read(self, name: str) -> tuple[bytes, bytes]:
        folder = self.root / name
        try:
            return (folder / "state.pt").read_bytes(), (folder / "meta.json").read_bytes()
        except FileNotFoundError as exc:
            raise CheckpointError(f"checkpoint {folder} is missing or incomplete") from exc

    def _delete(self, name: str) -> None:
        shutil.rmtree(self.root / name, ignore_errors=True)

    def _set_latest(self, name: str) -> None:
        tmp = self.root / f".{LATEST}.tmp"
        tmp.write_text(name)
        with tmp.open("rb+") as fh:
            os.fsync(fh.fileno())
        tmp.replace(self.root / LATEST)
        _fsync_dir(self.root)

    def _get_latest(self) -> str | None:
        try:
            return (self.root / LATEST).read_text().strip() or None
        except FileNotFoundError:
            return None


class S3CheckpointStore(CheckpointStore):
    """Checkpoints under ``s3://bucket/prefix/``. Endpoint and credentials come from boto3's usual
    environment (AWS_ENDPOINT_URL_S3 points it at a local server in tests)."""

    def __init__(self, uri: str, keep: int = 3, client=None) -> None:
        super().__init__(keep)
        if not uri.startswith("s3://"):
            raise ValueError(f"not an s3:// URI: {uri}")
        bucket, _, prefix = uri[5:].partition("/")
        if not bucket:
            raise ValueError(f"no bucket in {uri}")
        self.bucket, self.prefix = bucket, prefix.strip("/")
        if client is None:
            import boto3

            client = boto3.client("s3")
        self._s3 = client

    def _key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def _call(self, what: str, fn, **kw):
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(**kw)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise FileNotFoundError(kw.get("Key")) from exc
            raise CheckpointError(f"S3 {what} s3://{self.bucket}/{kw.get('Key', kw.get('Prefix', ''))}: {exc}") from exc
        except BotoCoreError as exc:
            raise CheckpointError(f"S3 {what} failed: {exc}") from exc

    def names(self) -> list[str]:
        names: set[str] = set()
        paginator = self._s3.get_paginator("list_objects_v2")
        prefix = self._key("step-")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
                for obj in page.get("Contents", []):
                    key = obj["Key"]
                    if key.endswith("/meta.json"):
                        names.add(key.rsplit("/", 2)[-2])
        except Exception as exc:  # noqa: BLE001 - botocore's error types, mapped once here
            raise CheckpointError(f"S3 list s3://{self.bucket}/{prefix}: {exc}") from exc
        return sorted(names)

    def _write(self, name: str, state: bytes, meta: bytes) -> None:
        self._call("put", self._s3.put_object, Bucket=self.bucket, Key=self._key(name, "state.pt"), Body=state)
        self._call("put", self._s3.put_object, Bucket=self.bucket, Key=self._key(name, "meta.json"), Body=meta)

    def _read(self, name: str) -> tuple[bytes, bytes]:
        try:
            meta = self._call("get", self._s3.get_object, Bucket=self.bucket, Key=self._key(name, "meta.json"))
            state = self._call("get", self._s3.get_object, Bucket=self.bucket, Key=self._key(name, "state.pt"))
        except FileNotFoundError as exc:
            raise CheckpointError(f"checkpoint s3://{self.bucket}/{self._key(name)} is missing or incomplete") from exc
        return state["Body"].read(), meta["Body"].read()

    def _delete(self, name: str) -> None:
        for fname in ("meta.json", "state.pt"):  # meta first: the checkpoint stops counting at once
            self._call("delete", self._s3.delete_object, Bucket=self.bucket, Key=self._key(name, fname))

    def _set_latest(self, name: str) -> None:
        self._call("put", self._s3.put_object, Bucket=self.bucket, Key=self._key(LATEST), Body=name.encode())

    def _get_latest(self) -> str | None:
        try:
            obj = self._call("get", self._s3.get_object, Bucket=self.bucket, Key=self._key(LATEST))
        except FileNotFoundError:
            return None
        return obj["Body"].read().decode().strip() or None


def open_checkpoint_store(location: str | Path, keep: int = 3) -> CheckpointStore:
    """A local folder, or an ``s3://bucket/prefix`` URI."""
    loc = str(location)
    if loc.startswith("s3://"):
        return S3CheckpointStore(loc, keep=keep)
    return LocalCheckpointStore(loc, keep=keep)
