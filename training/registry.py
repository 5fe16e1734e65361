"""The model registry: immutable bundle versions and movable aliases, in a folder or on S3.

    {root}/bundles/{version}/      a bundle (training.bundle), never changed or removed once written
    {root}/aliases/{alias}         one line: the version the alias points at (champion, challenger, …)
    {root}/alias-history/{alias}/{ns}.json   one immutable record per move: version, previous, at, reason

In a folder (:class:`Registry`), publishing copies a bundle into a temp folder and renames it into
place; moving an alias writes a temp file and renames it over the old one. Both are atomic on one
filesystem, so a service that watches an alias never reads half a bundle or half a pointer, and
nothing it holds is deleted or renamed under it.

On S3 (:class:`S3Registry`, ``s3://bucket/prefix``) every object is one atomic PUT; a version's
``manifest.json`` is uploaded last and is what makes the version exist, so a half-uploaded version is
invisible. A reader downloads a version once into a local cache folder (verified against the
manifest's checksums, then renamed into place): versions are immutable, so the cache never goes stale.
:func:`open_registry` picks one by the location's form.

Every alias move first writes its history record, then the pointer: a move that dies between the two
leaves a record the pointer does not follow, and the pointer stays the truth. ``rollback`` points the
alias back at the version it held before its current one (a rollback is itself a recorded move).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

from training.bundle import BundleError, read_manifest, verify_bundle

MANIFEST = "manifest.json"  # a bundle's index of files and checksums (training.bundle)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class RegistryError(ValueError):
    """An unknown alias or version, a bad name, or a version that already exists."""


def _name(kind: str, value: str) -> str:
    if not _NAME.match(value):
        raise RegistryError(f"{kind} {value!r}: use letters, digits, '.', '_' or '-' (at most 128)")
    return value


class _Aliases:
    """Alias moves with their history, over a backend's ``_point``, ``_record`` and ``history``."""

    def _point(self, alias: str, version: str) -> None: ...  # move the pointer (atomic)
    def _record(self, alias: str, key: str, record: dict) -> None: ...  # write one immutable record
    def history(self, alias: str) -> list[dict]: ...  # records, oldest first
    def resolve(self, alias: str) -> str: ...

    def set_alias(self, alias: str, version: str, reason: str = "set") -> None:
        """Point ``alias`` at ``version`` (which must exist), recording the move."""
        _name("alias", alias)
        try:
            previous: str | None = self.resolve(alias)
        except RegistryError:
            previous = None
        self._require(version)
        now = time.time_ns()
        self._record(alias, f"{now:020d}", {"version": version, "previous": previous, "at": now / 1e9,
                                              "reason": reason})
        self._point(alias, version)

    def _require(self, version: str) -> None: ...

    def rollback(self, alias: str) -> str:
        """Point ``alias`` back at the version it held before the current one; returns that version."""
        current = self.resolve(alias)
        for record in reversed(self.history(alias)):
            if record["version"] == current and record.get("previous"):
                self.set_alias(alias, record["previous"], reason=f"rollback from {current}")
                return record["previous"]
        raise RegistryError(f"alias {alias!r} has no earlier version to roll back to")


class Registry(_Aliases):
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.uri = str(self.root)

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

    def _require(self, version: str) -> None:
        if not self.bundle_dir(version).is_dir():
            raise RegistryError(f"no version {version} in {self.root}")

    def _point(self, alias: str, version: str) -> None:
        _atomic_write(self.root / "aliases" / _name("alias", alias), version + "\n")

    def _record(self, alias: str, key: str, record: dict) -> None:
        _atomic_write(self.root / "alias-history" / alias / f"{key}.json", json.dumps(record))

    def history(self, alias: str) -> list[dict]:
        folder = self.root / "alias-history" / _name("alias", alias)
        return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []

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


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{time.time_ns()}"
    tmp.write_text(text)
    os.replace(tmp, path)


def _bundle_files(bundle: Path) -> list[Path]:
    return sorted(p for p in bundle.rglob("*") if p.is_file())


class S3Registry(_Aliases):
    """The same registry on S3: ``bundle_dir(version)`` is a verified local copy in ``cache_dir``."""

    def __init__(self, uri: str, cache_dir: str | Path, aws=None) -> None:  # aws: training.spot.aws.Aws
        from training.spot.aws import Aws

        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        if not uri.startswith("s3://") or not bucket:
            raise RegistryError(f"not an S3 registry: {uri!r} (expected s3://bucket/prefix)")
        self.uri, self.bucket, self.prefix = uri.rstrip("/"), bucket, prefix.strip("/")
        self.cache = Path(cache_dir)
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        self.s3 = (aws or Aws(region)).client("s3")  # the endpoint: AWS_ENDPOINT_URL, as boto3 reads it

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _call(self, what: str, fn, **kwargs):
        from training.spot.aws import CloudError, call

        try:
            return call(f"s3 {what}", fn, **kwargs)
        except CloudError as exc:
            if exc.code in ("NoSuchKey", "404"):
                return None
            raise RegistryError(f"registry {self.uri}: {exc}") from exc

    def _get(self, key: str) -> bytes | None:
        resp = self._call(f"get {self.uri}/{key}", self.s3.get_object, Bucket=self.bucket, Key=self._key(key))
        return None if resp is None else resp["Body"].read()

    def _put(self, key: str, data: bytes) -> None:
        self._call(f"put {self.uri}/{key}", self.s3.put_object, Bucket=self.bucket, Key=self._key(key), Body=data)

    def _keys(self, prefix: str) -> list[str]:
        strip = len(self.prefix) + 1 if self.prefix else 0
        paginator = self.s3.get_paginator("list_objects_v2")
        pages = self._call(f"list {self.uri}/{prefix}", lambda: list(
            paginator.paginate(Bucket=self.bucket, Prefix=self._key(prefix)))) or []
        return sorted(obj["Key"][strip:] for page in pages for obj in page.get("Contents", []))

    def _exists(self, version: str) -> bool:
        key = self._key(f"bundles/{_name('version', version)}/{MANIFEST}")
        return self._call(f"head {self.uri}/{key}", self.s3.head_object, Bucket=self.bucket, Key=key) is not None

    def publish(self, bundle: str | Path, version: str | None = None) -> str:
        """Upload a verified bundle as ``version``; its manifest goes last (the commit point)."""
        manifest = verify_bundle(bundle)
        version = _name("version", version or manifest["model_version"])
        if self._exists(version):
            raise RegistryError(f"version {version} is already published (versions are immutable)")
        files = _bundle_files(Path(bundle))
        for path in sorted(files, key=lambda p: p.name == MANIFEST):  # manifest.json last
            self._put(f"bundles/{version}/{path.relative_to(bundle).as_posix()}", path.read_bytes())
        return version

    def _require(self, version: str) -> None:
        if not self._exists(version):
            raise RegistryError(f"no version {version} in {self.uri}")

    def _point(self, alias: str, version: str) -> None:
        self._put(f"aliases/{_name('alias', alias)}", (version + "\n").encode())

    def _record(self, alias: str, key: str, record: dict) -> None:
        self._put(f"alias-history/{alias}/{key}.json", json.dumps(record).encode())

    def history(self, alias: str) -> list[dict]:
        return [json.loads(self._get(k) or b"{}") for k in self._keys(f"alias-history/{_name('alias', alias)}/")]

    def resolve(self, alias: str) -> str:
        data = self._get(f"aliases/{_name('alias', alias)}")
        if data is None:
            raise RegistryError(f"alias {alias!r} is not set in {self.uri}")
        return data.decode().strip()

    def versions(self) -> list[str]:
        return sorted(k.split("/")[1] for k in self._keys("bundles/") if k.count("/") == 2
                      and k.endswith(f"/{MANIFEST}"))

    def aliases(self) -> dict[str, str]:
        return {k.split("/", 1)[1]: self.resolve(k.split("/", 1)[1]) for k in self._keys("aliases/")}

    def manifest(self, version: str) -> dict:
        data = self._get(f"bundles/{_name('version', version)}/{MANIFEST}")
        if data is None:
            raise RegistryError(f"no version {version} in {self.uri}")
        try:
            return json.loads(data)
        except ValueError as exc:
            raise RegistryError(f"version {version} in {self.uri}: {MANIFEST} is not valid JSON") from exc

    def bundle_dir(self, version: str) -> Path:
        """The version as a local folder: downloaded once, checksums verified, renamed into place."""
        target = self.cache / _name("version", version)
        if target.is_dir():
            return target
        keys = self._keys(f"bundles/{version}/")
        if f"bundles/{version}/{MANIFEST}" not in keys:
            raise RegistryError(f"no version {version} in {self.uri}")
        tmp = self.cache / f".tmp-{version}-{os.getpid()}-{time.time_ns()}"
        try:
            for key in keys:
                path = tmp / key.removeprefix(f"bundles/{version}/")
                path.parent.mkdir(parents=True, exist_ok=True)
                data = self._get(key)
                if data is None:
                    raise RegistryError(f"{self.uri}/{key} vanished while downloading (versions are immutable)")
                path.write_bytes(data)
            try:
                verify_bundle(tmp)
            except BundleError as exc:
                raise RegistryError(f"version {version} in {self.uri} does not verify: {exc}") from exc
            try:
                tmp.rename(target)
            except OSError:  # another process cached it first: theirs is the same immutable version
                if not target.is_dir():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return target


def open_registry(location: str | Path, cache_dir: str | Path | None = None) -> Registry | S3Registry:
    """A folder, or ``s3://bucket/prefix`` (versions cached under ``cache_dir``, by default
    ``~/.cache/dinrec/registry/<bucket>/<prefix>``)."""
    text = str(location)
    if text.startswith("s3://"):
        cache = Path(cache_dir) if cache_dir else Path.home() / ".cache" / "dinrec" / "registry" / \
            text.removeprefix("s3://").strip("/")
        return S3Registry(text, cache)
    if "://" in text:
        raise RegistryError(f"unsupported registry {text!r}: use a folder or s3://bucket/prefix")
    return Registry(text)
