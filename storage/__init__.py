"""One storage layer: a local folder or an S3 prefix, keys → bytes.

The event archive (streams.archive), checkpoints (training.checkpoint), spot job state
(spot) and the model registry (registry.store) all sit on it, so each gets the same two
guarantees on both backends:

* **a key is written whole or not at all** — an S3 PUT is atomic per object; locally the bytes go
  to a temp file (fsynced, with its folder, when ``durable``) that is renamed over the key;
* **a reader never trusts a half-written group** — a multi-key thing (a checkpoint, a bundle
  version) writes its index key last (``meta.json``, ``manifest.json``) and exists only once that
  key does; a pointer (``latest``, an alias) is one key, moved atomically.

AWS errors are mapped once, here (:func:`call` → :class:`CloudError`, which spot's AWS
boundary uses too); a missing key reads as None.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dinrec.storage.aws import CloudError, aws_client, call, reraise_as, s3_client
from dinrec.storage.base import Storage, Versioned, WriteConflict
from dinrec.storage.files import file_sha256, folder_written_atomically, fsync_dir, write_atomically
from dinrec.storage.lease import Lease, LeaseHeld, LeaseLost
from dinrec.storage.local import LocalStorage
from dinrec.storage.outage import DependencyUnavailable, MissingDependency, outage
from dinrec.storage.s3 import S3Storage

__all__ = ["CloudError", "DependencyUnavailable", "Lease", "LeaseHeld", "LeaseLost", "LocalStorage",
           "MissingDependency", "S3Storage", "Storage", "Versioned", "WriteConflict", "aws_client", "call",
           "file_sha256", "folder_written_atomically", "fsync_dir", "open_storage", "outage", "reraise_as",
           "s3_client", "write_atomically"]


def open_storage(uri: str | Path, client: Any = None, durable: bool = False) -> Storage:
    """A local folder, or ``s3://bucket/prefix`` (``client``: a boto3 S3 client to use)."""
    text = str(uri)
    if text.startswith("s3://"):
        return S3Storage(text, client)
    if "://" in text:
        raise ValueError(f"unsupported storage {text!r}: use a folder or s3://bucket/prefix")
    return LocalStorage(text, durable=durable)
