"""Which model serves, and swapping it without downtime.

With ``DINREC_REGISTRY`` (a folder or ``s3://bucket/prefix``) the service serves the version an
alias (``DINREC_MODEL_ALIAS``, default ``champion``) points at, and watches the alias: when it
moves, the new bundle is loaded in the background (checksums verified), smoke-scored, and swapped
in with one reference assignment.
A request reads the model once when it starts, so requests in flight finish on the model they
started with; the previous model is kept for ``rollback``. A bundle that fails to load or to score
is refused and the current model keeps serving. Without a registry, ``DINREC_BUNDLE_DIR`` is served
as before.

A registry whose alias names no version yet (a new deployment, before the first retrain publishes) does not
stop the service: it starts without a model and waits for the alias. Meanwhile events are accepted (they
are what the first retrain trains on), ``/recommend`` answers 503 ``no_model`` and ``/readyz`` says why.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Callable
from pathlib import Path

from dinrec.events.features import HistoryItem
from dinrec.models.bundle import load_bundle
from dinrec.models.ranking import Recommender
from dinrec.registry.store import Registry, S3Registry, UnknownAlias, open_registry
from dinrec.retrieval.index import FaissIndex, IndexSpec, set_search_threads
from dinrec.serving.settings import ServingSettings
from dinrec.storage.loops import every

log = logging.getLogger(__name__)


class ReloadFailed(RuntimeError):
    """A new model could not be loaded or did not score; the current one keeps serving."""


class NoModelYet(RuntimeError):
    """The registry's alias names no version yet: nothing serves until the first one is published."""


def load_recommender(settings: ServingSettings, bundle_dir: Path) -> Recommender:
    import torch

    # Each worker process gets its share of the cores: more threads than that only contend.
    threads = settings.torch_threads or max(1, (os.cpu_count() or 1) // (settings.workers or 1))
    torch.set_num_threads(threads)
    set_search_threads(threads)  # FAISS has its own OpenMP pool: idle threads in it spin on every search
    bundle = load_bundle(bundle_dir)
    spec = bundle.item_index_info.get("spec", {})
    ef_search = settings.recall_ef_search or spec.get("ef_search", IndexSpec.ef_search)
    index = FaissIndex.load(bundle.item_index_path, ef_search=ef_search)
    return Recommender(bundle, index, settings, settings.score_precision)


def smoke_score(rec: Recommender) -> None:
    """Rank a made-up user of the bundle's most popular items; raise unless it gives sane scores."""
    items = [i for i, _ in rec.bundle.popularity[:10]]
    history = [HistoryItem(float(t), f"smoke-{t}", item, rec.category_of(item)) for t, item in enumerate(items)]
    ranking = rec.rank(history, 5, lambda n: rec.bundle.popularity)
    if not ranking.items or not all(math.isfinite(x.score) for x in ranking.items):
        raise ReloadFailed(f"model {rec.model_version} gave no usable scores on a smoke request")


class ModelManager:
    def __init__(self, settings: ServingSettings, on_swap: Callable[[Recommender], None],
                 prepare: Callable[[Recommender], object] | None = None) -> None:
        """``prepare(rec)``: called on every model loaded, before it may serve (the catalog's new items)."""
        self.settings = settings
        self._prepare = prepare
        self.registry = open_registry(settings.registry, settings.registry_cache) if settings.registry else None
        self._on_swap = on_swap
        self._lock = threading.Lock()  # one load at a time
        self.version: str | None = None  # the registry version serving (None without a registry)
        self.previous: tuple[str | None, Recommender] | None = None
        self.watch_checks = 0  # completed polls of the watcher: tests and operators see it is alive
        # An alias target the watcher must not load: it failed, or the operator chose another version
        # (a pinned reload, a rollback). Cleared in effect when the alias moves on.
        self._hold: str | None = None
        self.current: Recommender | None = None  # None only while the alias names no version yet
        try:
            target = self._target_version()
        except UnknownAlias:
            pass  # a new deployment: the service starts without a model and says why (waiting())
        else:
            self.current = self._load(target)
        # Models experiment variants name (a registry alias or version) -> (version, model), beside
        # the one that serves everyone else; an alias is followed by the watcher like the main one.
        self.variants: dict[str, tuple[str, Recommender]] = {}

    def load_variants(self, names: set[str]) -> None:
        """Load (verified, smoke-scored) every model the running experiments' variants name."""
        if names and self.registry is None:
            raise ValueError(f"experiment variants name models {sorted(names)} but no registry is set "
                             "(DINREC_REGISTRY)")
        for name in sorted(names):
            self._load_variant(name)

    def _need_registry(self, why: str) -> Registry | S3Registry:
        if self.registry is None:
            raise ReloadFailed(f"{why}: no registry is set (DINREC_REGISTRY)")
        return self.registry

    def _variant_version(self, name: str) -> str:
        try:
            return self._need_registry(f"model {name!r}").resolve(name)
        except UnknownAlias:
            return name  # not an alias: a version

    def _load_variant(self, name: str) -> None:
        version = self._variant_version(name)
        bundle_dir = self._need_registry(f"experiment variant model {name!r}").bundle_dir(version)
        if not Path(bundle_dir).is_dir():
            raise ReloadFailed(f"experiment variant model {name!r}: no version {version!r} in the registry")
        rec = self._verified(bundle_dir)
        self.variants = {**self.variants, name: (version, rec)}  # replaced whole: requests read it lock-free
        log.info("experiment variant model %s: version %s (%s)", name, version, rec.model_version)

    def promote(self, alias: str, model: str) -> str:
        """Point ``alias`` at the version ``model`` (an alias or a version) names; returns the version.
        Replicas serving ``alias`` pick it up with their next poll."""
        version = self._variant_version(model)
        self._need_registry(f"promoting {model!r} to {alias!r}").set_alias(alias, version, reason="A/B winner")
        return version

    @property
    def held(self) -> str | None:
        """The version the alias names that is held back (refused or rolled back from), if it names one."""
        return self._hold if self._hold is not None and self._hold != self.version else None

    def serving(self) -> list[Recommender]:
        """Every model serving now: the main one (once there is one) and the experiment variants'."""
        return [*([self.current] if self.current is not None else []), *(rec for _, rec in self.variants.values())]

    @property
    def model_version(self) -> str | None:
        """The serving model's version string; None while waiting for the first."""
        return self.current.model_version if self.current is not None else None

    def waiting(self) -> str | None:
        """Why no model serves (a new deployment waiting for its first), or None when one does."""
        if self.current is not None:
            return None
        alias = self.settings.model_alias
        return (f"no model serves yet: the registry's alias {alias!r} names no version; the first retrain (or "
                f"`dinrec models publish … --alias {alias}`) publishes one, and the watcher loads it")

    def serving_or_raise(self) -> Recommender:
        """The model serving now; NoModelYet (the service answers 503 no_model) while there is none."""
        rec = self.current
        if rec is None:
            raise NoModelYet(self.waiting())
        return rec

    def variant_model(self, name: str) -> Recommender:
        return self.variants[name][1]

    def _target_version(self) -> str | None:
        return self.registry.resolve(self.settings.model_alias) if self.registry else None

    def _verified(self, bundle_dir: Path) -> Recommender:
        """A bundle loaded (checksums verified) and smoke-scored: what may serve."""
        rec = load_recommender(self.settings, bundle_dir)
        if self._prepare is not None:
            self._prepare(rec)
        smoke_score(rec)
        return rec

    def _load(self, version: str | None) -> Recommender:
        bundle_dir = self.registry.bundle_dir(version) if self.registry and version else self.settings.bundle_dir
        rec = self._verified(bundle_dir)
        self.version = version
        return rec

    def reload(self, version: str | None = None) -> bool:
        """Serve ``version`` (default: where the alias points now) if it is not serving already;
        True when the model changed. Raises ReloadFailed (nothing changes) if the new one is bad."""
        with self._lock:
            target = version or self._target_version()
            if target == self.version and version is None and self.registry is not None:
                self._hold = None  # serving what the alias names: following it, nothing held back
                return False
            old_version, old = self.version, self.current
            try:
                new = self._load(target)
            except Exception as exc:  # noqa: BLE001 - whatever breaks a bundle, keep serving the old one
                self.version = old_version
                self._hold = target
                raise ReloadFailed(f"cannot serve {target or self.settings.bundle_dir}: {exc}") from exc
            if version is not None and self.registry is not None:  # pinned: the watcher leaves it be
                self._hold = self._target_version()
            else:  # following the alias again: nothing is held back
                self._hold = None
            if old is not None:  # the first model has nothing to roll back to
                self.previous = (old_version, old)
            self._swap(new)
            log.info("now serving model %s (version %s, was %s)", new.model_version, target, old_version)
            return True

    def rollback(self) -> str:
        with self._lock:
            if self.previous is None:
                raise ReloadFailed("no previous model to roll back to")
            assert self.current is not None  # a model was swapped in when the previous one was kept
            (version, rec), self.previous = self.previous, (self.version, self.current)
            self.version = version
            if self.registry is not None:  # the alias still names what was rolled back from
                self._hold = self._target_version()
            self._swap(rec)
            log.warning("rolled back to model %s (version %s)", rec.model_version, version)
            return rec.model_version

    def _swap(self, rec: Recommender) -> None:
        self.current = rec
        self._on_swap(rec)

    def watch(self, stop: threading.Event) -> threading.Thread | None:
        """Poll the alias every ``reload_poll_s`` and reload when it moves (None without a registry)."""
        if self.registry is None:
            return None

        def poll() -> None:
            try:
                if self._target_version() not in (self.version, self._hold):
                    self.reload()
            except UnknownAlias as exc:
                if self.current is not None:  # the alias was deleted under a serving fleet: say so, keep serving
                    log.error("model alias unreadable; still serving %s: %s", self.current.model_version, exc)
            except Exception as exc:  # noqa: BLE001 - a bad alias or bundle: the current model keeps serving
                log.error("model reload failed; still serving %s: %s", self.model_version or "no model", exc)
            for name, (version, _) in list(self.variants.items()):
                try:
                    if self._variant_version(name) != version:
                        self._load_variant(name)
                except Exception as exc:  # noqa: BLE001 - the variant keeps its current model
                    log.error("variant model %s reload failed; keeping version %s: %s", name, version, exc)
            self.watch_checks += 1

        return every(self.settings.reload_poll_s, stop, poll, name="dinrec-model-watch")
