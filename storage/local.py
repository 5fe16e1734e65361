"""A local folder as storage."""

from __future__ import annotations

from pathlib import Path

from storage.base import Storage
from storage.files import write_atomically


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
