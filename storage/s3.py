"""An S3 prefix as storage."""

from __future__ import annotations

from typing import Any

from dinrec.storage.aws import CloudError, call, s3_client
from dinrec.storage.base import Storage, Versioned, WriteConflict


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
        found = self.get_versioned(key)
        return None if found is None else found.data

    def get_versioned(self, key: str) -> Versioned | None:
        try:
            resp = call(f"s3 get {self.child_uri(key)}", self.s3.get_object, Bucket=self.bucket, Key=self._key(key))
        except CloudError as exc:
            if exc.code in ("NoSuchKey", "404"):
                return None
            raise
        return Versioned(resp["Body"].read(), resp["ETag"])

    def put_if(self, key: str, data: bytes, version: str | None) -> str:
        """S3's conditional writes: ``If-None-Match: *`` to create, ``If-Match: <ETag>`` to replace."""
        condition = {"IfNoneMatch": "*"} if version is None else {"IfMatch": version}
        try:
            resp = call(f"s3 conditional put {self.child_uri(key)}", self.s3.put_object, Bucket=self.bucket,
                        Key=self._key(key), Body=data, **condition)
        except CloudError as exc:
            # 412: the key changed; 409 ConditionalRequestConflict: another conditional write to it is in
            # flight; NoSuchKey: If-Match on a key removed since it was read.
            if exc.code in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409", "NoSuchKey", "404"):
                raise WriteConflict(f"{self.child_uri(key)} changed since it was read ({exc.code})") from exc
            raise
        return resp["ETag"]

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
