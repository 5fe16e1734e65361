"""The model registry: immutable bundle versions and movable aliases, in a folder.

    {root}/bundles/{version}/      a bundle (training.bundle), never changed or removed once written
    {root}/aliases/{alias}         one line: the version the alias points at (champion, challenger, …)

Publishing copies a bundle into a temp folder and renames it into place; moving an alias writes a
temp file and renames it over the old one. Both are atomic on one filesystem, so a service that
watches an alias never reads half a bundle or half a pointer, and nothing it holds is deleted or
renamed under it.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

from training.bundle import BundleError, read_manifest, verify_bundle

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class RegistryError(ValueError):
    """An unknown alias or version, a bad name, or a version that already exists."""


def _name(kind: str, value: str) -> str:
    if not _NAME.match(value):
        raise RegistryError(f"{kind} {value!r}: use letters, digits, '.', '_' or '-' (at most 128)")
    return value


class Registry:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def bundle_dir(self, version: str) -> Path:
        return self.root / "bundles" / _name("version", version)

    def publish(self, bundle: str | Path, version: str | None = None) -> str:
        """Copy a verified bundle in as ``version`` (default: its manifest's model version)."""
        manifest = verify_bundle(bundle)
        version = _name("version", version or manifest["model_version"])
        target = self.bundle_dir(version)
        if target.exists():
            raise RegistryError(f"version {version} is already published (versions are immutable)")
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f".tmp-{version}-{time.time_ns()}"
        shutil.copytree(bundle, tmp)
        try:
            tmp.rename(target)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise RegistryError(f"could not publish {version}: {exc}") from exc
        return version

    def set_alias(self, alias: str, version: str) -> None:
        if not self.bundle_dir(version).is_dir():
            raise RegistryError(f"no version {version} in {self.root}")
        path = self.root / "aliases" / _name("alias", alias)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".{alias}.{time.time_ns()}"
        tmp.write_text(version + "\n")
        os.replace(tmp, path)

    def resolve(self, alias: str) -> str:
        try:
            return (self.root / "aliases" / _name("alias", alias)).read_text().strip()
        except FileNotFoundError as exc:
            raise RegistryError(f"alias {alias!r} is not set in {self.root}") from exc

    def versions(self) -> list[str]:
        folder = self.root / "bundles"
        return sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")) \
            if folder.is_dir() else []

    def aliases(self) -> dict[str, str]:
        folder = self.root / "aliases"
        return {p.name: p.read_text().strip() for p in sorted(folder.iterdir())
                if p.is_file() and not p.name.startswith(".")} if folder.is_dir() else {}

    def manifest(self, version: str) -> dict:
        try:
            return read_manifest(self.bundle_dir(version))
        except BundleError as exc:
            raise RegistryError(str(exc)) from exc
