"""The model registry: immutable bundle versions and movable aliases, in a folder or on S3.

    {root}/bundles/{version}/      a bundle (models.bundle), never changed or removed once written
    {root}/aliases/{alias}         one line: the version the alias points at (champion, challenger, …)
    {root}/alias-history/{alias}/{ns}.json   one immutable record per move: version, previous, at, reason
    {root}/evaluations/{version}/{run}.json  what a retrain gate measured of the version on its holdout:
                                   its served HR@10 beside the champion's and the baselines', the decision

Both backends are the one storage layer (storage), whose writes are atomic per key.
Publishing writes a version's files with its ``manifest.json`` last: the manifest is what makes the
version exist, so a half-written version is invisible (and a publish that died is simply redone).
Moving an alias replaces one key, so a service that watches it never reads half a pointer, and
nothing it holds is deleted or renamed under it.

In a folder (:class:`Registry`) a version is read where it lies. On S3 (:class:`S3Registry`,
``s3://bucket/prefix``) a reader downloads a version once into a local cache folder (verified against
the manifest's checksums, then renamed into place): versions are immutable, so the cache never goes
stale. :func:`open_registry` picks one by the location's form.

Every alias move first writes its history record, then the pointer: a move that dies between the two
leaves a record the pointer does not follow, and the pointer stays the truth. ``rollback`` points the
alias back at the version it held before its current one (a rollback is itself a recorded move).
The pointer is written only if it still holds what the mover read (the storage layer's
compare-and-swap: S3's conditional writes, a lock beside the file in a folder), so of two moves racing
exactly one lands and the other raises :class:`AliasConflict`; a mover can also name the version it
expects the alias to hold (``expected``), as the retrain job does with the champion it gated against.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from dinrec.models.bundle import MANIFEST_FILE as MANIFEST
from dinrec.models.bundle import BundleError, listed_files, read_manifest, verify_bundle
from dinrec.storage import (
    LocalStorage,
    S3Storage,
    Storage,
    WriteConflict,
    folder_written_atomically,
    open_storage,
    reraise_as,
)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class RegistryError(ValueError):
    """An unknown alias or version, a bad name, or a version that already exists."""


class UnknownAlias(RegistryError):
    """The alias is not set: the registry answered, and has no such alias (an outage is not this; it is
    an error caused by a storage.DependencyUnavailable or a transient CloudError)."""


class AliasConflict(RegistryError):
    """The alias did not hold the version its mover expected, or moved while it was being moved:
    nothing moved. Read it again and decide again."""


ANY = "*"  # set_alias(expected=ANY): whatever the alias holds now (the move is still conditional on it)


def _name(kind: str, value: str) -> str:
    if not _NAME.match(value):
        raise RegistryError(f"{kind} {value!r}: use letters, digits, '.', '_' or '-' (at most 128)")
    return value


class _StoredRegistry:
    """Versions, aliases and their history on a :class:`storage.Storage`."""

    def __init__(self, storage: Storage) -> None:
        self.storage, self.uri = storage, storage.uri

    def _call(self, what: str, fn, *args):
        return reraise_as(RegistryError, f"registry {self.uri}", what, fn, *args)

    def _get(self, key: str) -> bytes | None:
        return self._call(f"get {key}", self.storage.get_bytes, key)

    def _exists(self, version: str) -> bool:
        key = f"bundles/{_name('version', version)}/{MANIFEST}"
        return bool(self._call(f"head {key}", self.storage.exists, key))

    # ------------------------------------------------------------------ versions
    def publish(self, bundle: str | Path, version: str | None = None) -> str:
        """Store a verified bundle as ``version`` (default: its manifest's model version); its
        manifest goes last (the commit point)."""
        manifest = verify_bundle(bundle)
        version = _name("version", version or manifest["model_version"])
        if self._exists(version):
            raise RegistryError(f"version {version} is already published (versions are immutable)")
        self._call(f"publish {version}", self.storage.upload_dir, Path(bundle), f"bundles/{version}", MANIFEST)
        return version

    def versions(self) -> list[str]:
        keys = self._call("list bundles/", self.storage.keys, "bundles/")
        return sorted(k.split("/")[1] for k in keys if k.count("/") == 2 and k.endswith(f"/{MANIFEST}"))

    def manifest(self, version: str) -> dict:
        data = self._get(f"bundles/{_name('version', version)}/{MANIFEST}")
        if data is None:
            raise RegistryError(f"no version {version} in {self.uri}")
        try:
            return json.loads(data)
        except ValueError as exc:
            raise RegistryError(f"version {version} in {self.uri}: {MANIFEST} is not valid JSON") from exc

    def _require(self, version: str) -> None:
        if not self._exists(version):
            raise RegistryError(f"no version {version} in {self.uri}")

    # ------------------------------------------------------------------ evaluations
    def record_evaluation(self, version: str, run: str, record: dict) -> None:
        """Keep what a gate run measured of ``version`` (which must exist) beside it, not in the
        bundle (whose files are checksummed and immutable). One key per run: a resumed run rewrites
        its own record."""
        self._require(version)
        self._call("record evaluation", self.storage.put_bytes,
                   f"evaluations/{version}/{_name('run', run)}.json", json.dumps(record).encode())

    def evaluations(self, version: str) -> list[dict]:
        """Every gate run's record of ``version``, in run order (run ids sort by time)."""
        keys = self._call("list evaluations", self.storage.keys, f"evaluations/{_name('version', version)}/")
        return [json.loads(self._get(k) or b"{}") for k in sorted(keys) if k.endswith(".json")]

    # ------------------------------------------------------------------ aliases
    def resolve(self, alias: str) -> str:
        data = self._get(f"aliases/{_name('alias', alias)}")
        if data is None:
            raise UnknownAlias(f"alias {alias!r} is not set in {self.uri}")
        return data.decode().strip()

    def aliases(self) -> dict[str, str]:
        names = [k.split("/", 1)[1] for k in self._call("list aliases/", self.storage.keys, "aliases/")]
        return {name: self.resolve(name) for name in names if _NAME.match(name)}

    def history(self, alias: str) -> list[dict]:
        keys = self._call("list history", self.storage.keys, f"alias-history/{_name('alias', alias)}/")
        return [json.loads(self._get(k) or b"{}") for k in keys if k.endswith(".json")]

    def set_alias(self, alias: str, version: str, reason: str = "set", *, expected: str | None = ANY) -> None:
        """Point ``alias`` at ``version`` (which must exist), recording the move. ``expected``: the version
        the caller believes the alias holds (None: not set); if it holds another, :class:`AliasConflict`
        and nothing moves. Either way the pointer is replaced only if it is still what was read here."""
        key = f"aliases/{_name('alias', alias)}"
        current = self._call(f"get {key}", self.storage.get_versioned, key)
        previous = current.data.decode().strip() if current else None
        if expected != ANY and expected != previous:
            raise AliasConflict(f"alias {alias!r} holds {previous or 'nothing'}, not {expected or 'nothing'} as "
                                f"expected: not moved to {version}")
        self._require(version)
        now = time.time_ns()
        record = {"version": version, "previous": previous, "at": now / 1e9, "reason": reason}
        self._call("record", self.storage.put_bytes, f"alias-history/{alias}/{now:020d}.json",
                   json.dumps(record).encode())
        try:
            self._call("move alias", self.storage.put_if, key, (version + "\n").encode(),
                       current.version if current else None)
        except WriteConflict as exc:
            raise AliasConflict(f"alias {alias!r} moved while it was being moved to {version} (it held "
                                f"{previous or 'nothing'}): not moved") from exc

    def rollback_target(self, alias: str) -> tuple[str, str]:
        """(the version ``alias`` holds, the one it held before it): what a rollback moves it back to."""
        current = self.resolve(alias)
        for record in reversed(self.history(alias)):
            if record["version"] == current and record.get("previous"):
                return current, record["previous"]
        raise RegistryError(f"alias {alias!r} has no earlier version to roll back to")

    def rollback(self, alias: str) -> str:
        """Point ``alias`` back at the version it held before the current one; returns that version."""
        current, back = self.rollback_target(alias)
        self.set_alias(alias, back, reason=f"rollback from {current}", expected=current)
        return back


class Registry(_StoredRegistry):
    """A registry in a folder: versions are read where they lie."""

    def __init__(self, root: str | Path) -> None:
        super().__init__(LocalStorage(root))
        self.root = Path(root)

    def bundle_dir(self, version: str) -> Path:
        return self.root / "bundles" / _name("version", version)

    def manifest(self, version: str) -> dict:
        if not self._exists(version):
            raise RegistryError(f"no version {version} in {self.root}")
        try:
            return read_manifest(self.bundle_dir(version))
        except BundleError as exc:
            raise RegistryError(str(exc)) from exc


class S3Registry(_StoredRegistry):
    """The same registry on S3: ``bundle_dir(version)`` is a verified local copy in ``cache_dir``."""

    def __init__(self, storage: S3Storage, cache_dir: str | Path) -> None:  # made by open_registry
        super().__init__(storage)
        self.cache = Path(cache_dir)

    def bundle_dir(self, version: str) -> Path:
        """The version as a local folder: downloaded once, checksums verified, renamed into place.

        Only the files its manifest lists are fetched, each by its plain name (``listed_files``), into a
        fresh folder, and verified there before it becomes visible: a key of the prefix that is not a
        bundle file (``bundles/v//etc/x``, ``bundles/v/../x``) is never written anywhere."""
        version = _name("version", version)
        target = self.cache / version
        if target.is_dir():
            return target
        manifest = self.manifest(version)
        try:
            names = [*listed_files(manifest), MANIFEST]
        except BundleError as exc:
            raise RegistryError(f"version {version} in {self.uri} is refused: {exc}") from exc
        # replace=False: another process that cached it first cached the same immutable version
        with folder_written_atomically(target, replace=False) as tmp:
            for name in names:
                data = self._get(f"bundles/{version}/{name}")
                if data is None:
                    raise RegistryError(f"{self.uri}/bundles/{version}/{name} is listed in the manifest but missing")
                (tmp / name).write_bytes(data)
            try:
                verify_bundle(tmp)
            except BundleError as exc:
                raise RegistryError(f"version {version} in {self.uri} does not verify: {exc}") from exc
        return target


def open_registry(location: str | Path, cache_dir: str | Path | None = None) -> Registry | S3Registry:
    """A folder, or ``s3://bucket/prefix`` (versions cached under ``cache_dir``, by default
    ``~/.cache/dinrec/registry/<bucket>/<prefix>``)."""
    try:
        storage = open_storage(location)
    except ValueError as exc:
        raise RegistryError(f"unsupported registry: {exc}") from exc
    if isinstance(storage, S3Storage):
        cache = Path(cache_dir) if cache_dir else Path.home() / ".cache" / "dinrec" / "registry" / \
            storage.bucket / storage.prefix
        return S3Registry(storage, cache)
    return Registry(location)
