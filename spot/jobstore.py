"""Where a spot job keeps its state: ``s3://bucket/prefix`` in production, a local folder for a
local run — small JSON documents and file uploads on the one storage layer (storage),
whose writes are atomic per key, so a reader never sees half a document."""

from __future__ import annotations

from dinrec.spot.aws import Aws
from dinrec.storage import LocalStorage, Storage, open_storage

JobStore = Storage
LocalJobStore = LocalStorage


def open_job_store(uri: str, aws: Aws | None = None) -> Storage:
    if uri.startswith("s3://") and aws is None:
        raise ValueError("an s3:// job store needs AWS settings")
    return open_storage(uri, aws.client("s3") if aws is not None else None)
