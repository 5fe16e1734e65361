"""The storage interface: keys → bytes, a key written whole or not at all, and written only if it is
still what the writer read (compare-and-swap) where two writers may race."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, NamedTuple


class WriteConflict(Exception):
    """A conditional write found the key changed (or created, or removed) since its writer read it:
    nothing was written. Read it again and decide again."""


class Versioned(NamedTuple):
    """A key's bytes and its version: an opaque token that changes whenever the bytes do (S3's ETag;
    a digest of the file locally)."""

    data: bytes
    version: str


class Storage(ABC):
    uri: str

    @abstractmethod
    def put_bytes(self, key: str, data: bytes) -> None:
        """Write ``key`` atomically (replacing it)."""

    @abstractmethod
    def get_bytes(self, key: str) -> bytes | None:
        """The bytes of ``key``, or None if there is no such key."""

    @abstractmethod
    def get_versioned(self, key: str) -> Versioned | None:
        """The bytes of ``key`` with their version, or None if there is no such key."""

    @abstractmethod
    def put_if(self, key: str, data: bytes, version: str | None) -> str:
        """Write ``key`` only if it is still at ``version`` (None: only if it does not exist), atomically
        with the check, and return the new version; raise :class:`WriteConflict` (nothing written) if not.
        Of two writers that read the same version, exactly one succeeds."""

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
        self.put_bytes(key, json_bytes(doc))

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


def json_bytes(doc: Any) -> bytes:
    """How a JSON document is stored (:meth:`Storage.put_json`, and conditional writes of one)."""
    return json.dumps(doc, indent=1, sort_keys=True, default=str).encode()
