"""The experiments document: the one owner of the A/B definitions every replica runs.

It is one versioned JSON document (:class:`experiments.spec.ExperimentFile`) on the storage layer — a
file in a folder, or an object on S3 (``DINREC_EXPERIMENTS_FILE``: ``/path/experiments.json`` or
``s3://bucket/prefix/experiments.json``) — and every change is a compare-and-swap on it
(:meth:`storage.Storage.put_if`): read the document and its storage version, apply the change, write
the next version only if the document is still the one read. Of two writers racing (two admin
requests on two replicas, the retrain job's rollout beside them) exactly one lands; the other gets
:class:`DocumentConflict` and nothing of theirs is written, so nobody's change is lost to a last
writer. A caller can also name the document version its change was made against (``expected``: an
admin client's ``If-Match``), and is refused if another change came first.

Replicas poll :meth:`ExperimentsDocument.read` and apply a new version (serving.admin_experiments).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from dinrec.experiments.spec import Experiment, ExperimentFile
from dinrec.storage import Storage, WriteConflict, open_storage


class DocumentConflict(RuntimeError):
    """The document changed since the change was made against it: nothing written."""

    def __init__(self, message: str, version: int) -> None:
        super().__init__(message)
        self.version = version  # the document's version now (what to read and retry against)


def split_location(location: str | Path) -> tuple[str, str]:
    """``/a/b/experiments.json`` → (``/a/b``, ``experiments.json``); ``s3://bucket/p/x.json`` →
    (``s3://bucket/p``, ``x.json``): the storage root and the document's key in it."""
    text = str(location).rstrip("/")
    if "/" not in text:
        return ".", text
    root, _, name = text.rpartition("/")
    if not name or (text.startswith("s3://") and root.count("/") < 2):
        raise ValueError(f"experiments document {text!r}: name a file, /path/experiments.json or "
                         "s3://bucket/prefix/experiments.json")
    return root or "/", name


class ExperimentsDocument:
    def __init__(self, storage: Storage, key: str) -> None:
        self.storage, self.key = storage, key
        self.uri = storage.child_uri(key)

    @classmethod
    def open(cls, location: str | Path) -> ExperimentsDocument:
        root, key = split_location(location)
        return cls(open_storage(root), key)

    def read(self) -> tuple[ExperimentFile, str | None]:
        """The document (version 0 and no experiments while none was written) and its storage version
        (None while absent); raises ValueError, naming the document, when it does not validate."""
        found = self.storage.get_versioned(self.key)
        if found is None:
            return ExperimentFile(), None
        return ExperimentFile.parse(found.data, self.uri), found.version

    def update(self, change: Callable[[list[Experiment]], list[Experiment]],
               expected: int | None = None) -> ExperimentFile:
        """Apply ``change`` to the experiments and write the next version, if nobody wrote in between
        (and, with ``expected``, if the document is at that version); returns what was written.
        ``change`` may raise to refuse (nothing written)."""
        current, token = self.read()
        if expected is not None and expected != current.version:
            raise DocumentConflict(f"{self.uri} is at version {current.version}, not {expected}: read it again",
                                   current.version)
        nxt = ExperimentFile(version=current.version + 1, experiments=change(list(current.experiments)))
        try:
            self.storage.put_if(self.key, nxt.model_dump_json(indent=1).encode(), token)
        except WriteConflict as exc:
            now, _ = self.read()
            raise DocumentConflict(f"{self.uri} changed while this change was made (now version {now.version}): "
                                   "nothing written; read it again", now.version) from exc
        return nxt
