"""Spot-safe training checkpoints, in a local directory or in S3 (by URI).

A checkpoint is ``step-000001234/`` holding ``state.pt`` (tensors and plain values only:
model, optimiser, schedule, grad scaler, every RNG, the data position, the best metric) and
``meta.json`` (format version, config, code version, dataset fingerprint), on the storage layer
(storage: a folder, written durably — fsynced — or S3). ``state.pt`` is written first,
``meta.json`` second, then the ``latest`` pointer; a checkpoint is *complete* once its ``meta.json``
exists, and a reader trusts no other. Deleting goes the other way: ``meta.json`` first.

The newest ``keep`` checkpoints are kept. ``state.pt`` is read with ``torch.load(weights_only=True)``,
so a checkpoint can never execute code.

With a ``key`` (``DINREC_CHECKPOINT_KEY``: a spot job's agent gives its trainer the job's own key,
spot.signing) every file of a checkpoint is signed (``sig`` beside ``meta.json``, ``shard-N.sig``
beside each shard) and a checkpoint is resumed only if its signatures are the key's: weights written by
anything without the key (another job's instance, where a role is shared) are refused, not resumed.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
from pathlib import Path

import torch

from dinrec.storage import Storage, open_storage, reraise_as

CHECKPOINT_FORMAT = "dinrec-checkpoint"
CHECKPOINT_FORMAT_VERSION = 1
LATEST = "latest"


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete, of an unknown version, or belongs to other data/config."""


def checkpoint_name(global_step: int) -> str:
    return f"step-{global_step:09d}"


class CheckpointStore:
    """Where checkpoints live. ``save`` is atomic; ``latest`` names the newest complete one."""

    def __init__(self, storage: Storage, keep: int = 3, prefix: str = "", key: str | None = None) -> None:
        if keep < 1:
            raise ValueError("keep must be >= 1")
        self.storage, self.keep, self.prefix, self.key = storage, keep, prefix, key

    def part(self, name: str) -> CheckpointStore:
        """The checkpoints of one part of a job (the recall towers: ``towers``), in ``name/`` here."""
        return CheckpointStore(self.storage, self.keep, prefix=f"{self.prefix}{name}/", key=self.key)

    def _signature(self, what: str, *parts: bytes) -> bytes:
        """What the key says of ``parts`` (their digests, under the file's own name: not reusable for another)."""
        assert self.key is not None  # only a store with a key signs or checks
        message = (self.prefix + what).encode() + b"".join(hashlib.sha256(p).digest() for p in parts)
        return hmac.new(self.key.encode(), message, hashlib.sha256).hexdigest().encode()

    def _check(self, what: str, signature: bytes | None, *parts: bytes) -> None:
        if self.key is None:
            return
        if signature is None or not hmac.compare_digest(signature, self._signature(what, *parts)):
            raise CheckpointError(f"checkpoint {self.storage.child_uri(self.prefix + what)}: not signed with this "
                                  "job's key (written by something else): refused")

    def _call(self, what: str, fn, *args):
        return reraise_as(CheckpointError, f"checkpoints {self.storage.uri}", what, fn, *args)

    def save(self, name: str, state: dict, meta: dict) -> None:
        buf = io.BytesIO()
        torch.save(state, buf)
        meta = {"format": CHECKPOINT_FORMAT, "format_version": CHECKPOINT_FORMAT_VERSION, **meta}
        meta_bytes = json.dumps(meta, indent=1, default=str).encode()
        self._call("write", self.storage.put_bytes, f"{self.prefix}{name}/state.pt", buf.getvalue())
        if self.key is not None:
            self._call("write", self.storage.put_bytes, f"{self.prefix}{name}/sig",
                       self._signature(name, buf.getvalue(), meta_bytes))
        self._call("write", self.storage.put_bytes, f"{self.prefix}{name}/meta.json", meta_bytes)  # last: complete
        self._call("write", self.storage.put_bytes, f"{self.prefix}{LATEST}", name.encode())
        for old in self.names()[:-self.keep]:
            self._delete(old)

    def save_shard(self, name: str, rank: int, data: bytes) -> None:
        """One rank's part of checkpoint ``name`` (a sharded run's tables: training.sharded), written
        before rank 0's :meth:`save` completes it."""
        self._call("write", self.storage.put_bytes, f"{self.prefix}{name}/shard-{rank:05d}.pt", data)
        if self.key is not None:
            self._call("write", self.storage.put_bytes, f"{self.prefix}{name}/shard-{rank:05d}.sig",
                       self._signature(f"{name}/shard-{rank:05d}", data))

    def load_shard(self, name: str, rank: int) -> dict:
        data = self._call("read", self.storage.get_bytes, f"{self.prefix}{name}/shard-{rank:05d}.pt")
        if data is None:
            raise CheckpointError(f"checkpoint {self.storage.child_uri(name)} has no shard for rank {rank}")
        self._check(f"{name}/shard-{rank:05d}", self._call(
            "read", self.storage.get_bytes, f"{self.prefix}{name}/shard-{rank:05d}.sig"), data)
        try:
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - as in load
            raise CheckpointError(f"checkpoint {name}: shard {rank} cannot be loaded safely: {exc}") from exc

    def load(self, name: str) -> tuple[dict, dict]:
        meta_bytes = self._call("read", self.storage.get_bytes, f"{self.prefix}{name}/meta.json")
        state_bytes = self._call("read", self.storage.get_bytes, f"{self.prefix}{name}/state.pt")
        if meta_bytes is None or state_bytes is None:
            raise CheckpointError(f"checkpoint {self.storage.child_uri(self.prefix + name)} is missing or incomplete")
        self._check(name, self._call("read", self.storage.get_bytes, f"{self.prefix}{name}/sig"), state_bytes,
                    meta_bytes)
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
        """The newest complete checkpoint: the pointer if it names one, else the newest stored."""
        names = self.names()
        pointed = (self._call("read", self.storage.get_bytes, f"{self.prefix}{LATEST}") or b"").decode().strip()
        if pointed in names:
            return pointed
        return names[-1] if names else None

    def names(self) -> list[str]:
        """Complete checkpoints, oldest first."""
        keys = [k[len(self.prefix):] for k in self._call("list", self.storage.keys, f"{self.prefix}step-")]
        return sorted(k.split("/")[0] for k in keys if k.count("/") == 1 and k.endswith("/meta.json"))

    def _delete(self, name: str) -> None:
        for fname in ("meta.json", "state.pt", "sig"):  # meta first: the checkpoint stops counting at once
            self._call("delete", self.storage.delete, f"{self.prefix}{name}/{fname}")
        for key in self._call("list", self.storage.keys, f"{self.prefix}{name}/shard-"):
            self._call("delete", self.storage.delete, key)


def open_checkpoint_store(location: str | Path, keep: int = 3, key: str | None = None) -> CheckpointStore:
    """A local folder (written durably: fsynced), or ``s3://bucket/prefix`` (endpoint and credentials
    as boto3 reads them; AWS_ENDPOINT_URL points it at a local server in tests); ``key``: sign and check."""
    return CheckpointStore(open_storage(location, durable=True), keep, key=key)
