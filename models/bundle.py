"""The model bundle: a self-describing, checksummed directory that serving loads.

    bundle/
      manifest.json        format + version, model version, code version, feature-schema version,
                           sha256 of every other file (verified on load), and lineage: the data
                           window, parent version and run that made it (retrained models)
      model.safetensors    weights (no pickle)
      model_config.json    DINConfig
      vocab.json           index → item id / category id, item → category
      metrics.json         offline metrics of this model (what promotion compares)
      popularity.json      most popular items, the fallback for users with no history
      item_counts.npy      behaviours per item index in the training log (what "long tail" means)
      towers.safetensors   recall towers (models.towers), with towers_config.json; optional:
                           without them recall uses DIN's item embeddings (models.recall)
      item_index.faiss     inner-product index of the recall space's item vectors
      covisit.npz          the co-visitation lane (retrieval.covisit): each item's nearest neighbours
      ranking_blend.json   the ranking stage's blend weights (models.blend); optional, with covisit:
                           without them the served score is DIN's alone

Readers refuse formats and versions they do not know, and any file whose checksum differs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from dinrec.events.long_tail import long_tail_mask
from dinrec.events.schema import SCHEMA_VERSION
from dinrec.models.blend import Blend
from dinrec.models.din import DIN, DINConfig
from dinrec.models.errors import BundleError
from dinrec.models.towers import Towers, TowersConfig
from dinrec.models.vocab import Vocab
from dinrec.retrieval.covisit import CoVisitation, PairTable
from dinrec.storage import file_sha256, folder_written_atomically

BUNDLE_FORMAT = "dinrec-bundle"
BUNDLE_FORMAT_VERSION = 1
ITEM_INDEX_FILE = "item_index.faiss"
ITEM_INDEX_INFO_FILE = "item_index.json"
ITEM_COUNTS_FILE = "item_counts.npy"
COVISIT_FILE = "covisit.npz"
BLEND_FILE = "ranking_blend.json"
MANIFEST_FILE = "manifest.json"


def code_version() -> str:
    try:
        from importlib.metadata import version

        return version("dinrec")
    except Exception:  # noqa: BLE001 - running from a source tree without metadata
        return "unknown"


@dataclass
class Bundle:
    path: Path
    manifest: dict
    config: DINConfig
    vocab: Vocab
    metrics: dict
    popularity: list[tuple[str, float]]
    model: DIN
    towers: Towers | None = None  # the recall towers (None: recall from DIN's item embeddings)
    item_counts: np.ndarray | None = None  # (n_items,) behaviours per item index (None: older bundles)
    covisit: CoVisitation | None = None  # the co-visitation lane (None: recall by the towers alone)
    blend: Blend | None = None  # the ranking blend (None: DIN's score alone)

    def context_sources(self) -> tuple[PairTable | None, torch.Tensor]:
        """What serving gives a DIN with context (models.context.served_context): the lane's pair table
        (None where the model reads no pairs; load refuses a pair-reading model without its lane) and the
        training counts (I,) float32 (zeros for bundles without them)."""
        pairs = None
        if self.model.cfg.pair_inputs:
            if self.covisit is None:  # load refuses it; a Bundle built in code could still lack it
                raise ValueError("its DIN reads co-visitation similarities and the bundle has no lane")
            pairs = PairTable([self.covisit])
        counts = (self.item_counts if self.item_counts is not None else np.zeros(len(self.vocab.items)))
        return pairs, torch.from_numpy(counts.astype(np.float32))

    def long_tail(self) -> np.ndarray | None:
        """(n_items,) bool by item index: the long tail (events.long_tail) by training count."""
        return long_tail_mask(self.item_counts) if self.item_counts is not None else None

    @property
    def model_version(self) -> str:
        return self.manifest["model_version"]

    @property
    def item_index_path(self) -> Path:
        return self.path / ITEM_INDEX_FILE

    @property
    def item_index_info(self) -> dict:
        """Kind, parameters and measured recall of the FAISS index ({} for bundles from before)."""
        path = self.path / ITEM_INDEX_INFO_FILE
        return json.loads(path.read_text()) if path.is_file() else {}

    @property
    def seq_len(self) -> int:
        """The history length the model was trained on: its input contract (model config; bundles
        written before it was kept there have it in their metrics)."""
        return int(self.config.extra.get("seq_len") or self.metrics.get("seq_len", 50))


def write_bundle(out: str | Path, model: DIN, vocab: Vocab, metrics: dict, popularity: list[tuple[str, float]],
                 extra_files: dict[str, Callable[[Path], None]] | None = None,
                 model_version: str | None = None, towers: Towers | None = None, lineage: dict | None = None) -> Path:
    """Write a bundle atomically: everything goes to a temp dir that is renamed into place. ``lineage``
    (the manifest's): where the model came from — data window, parent version, the run that made it."""
    out = Path(out)
    with folder_written_atomically(out) as tmp:
        state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        save_file(state, str(tmp / "model.safetensors"))
        (tmp / "model_config.json").write_text(json.dumps(model.cfg.to_json(), indent=1))
        if towers is not None:
            save_file({k: v.detach().cpu().contiguous() for k, v in towers.state_dict().items()},
                      str(tmp / "towers.safetensors"))
            (tmp / "towers_config.json").write_text(json.dumps(towers.cfg.to_json(), indent=1))
        (tmp / "vocab.json").write_text(json.dumps(vocab.to_json()))
        (tmp / "metrics.json").write_text(json.dumps(metrics, indent=1, default=str))
        (tmp / "popularity.json").write_text(json.dumps([[i, c] for i, c in popularity]))
        for name, writer in (extra_files or {}).items():
            writer(tmp / name)
        weights_hash = file_sha256(tmp / "model.safetensors")
        manifest = {
            "format": BUNDLE_FORMAT, "format_version": BUNDLE_FORMAT_VERSION,
            "model_version": model_version or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + weights_hash[:8],
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "code_version": code_version(), "feature_schema_version": SCHEMA_VERSION,
            "files": {p.name: file_sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()},
        }
        if lineage:
            manifest["lineage"] = lineage
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1))
    return out


def read_manifest(path: str | Path) -> dict:
    path = Path(path)
    try:
        manifest = json.loads((path / MANIFEST_FILE).read_text())
    except FileNotFoundError as exc:
        raise BundleError(f"{path}: no manifest.json; not a dinrec bundle") from exc
    except json.JSONDecodeError as exc:
        raise BundleError(f"{path}/manifest.json is not valid JSON") from exc
    if manifest.get("format") != BUNDLE_FORMAT:
        raise BundleError(f"{path}: format {manifest.get('format')!r} is not {BUNDLE_FORMAT!r}")
    if manifest.get("format_version") != BUNDLE_FORMAT_VERSION:
        raise BundleError(f"{path}: bundle format version {manifest.get('format_version')!r} is not supported "
                          f"(this dinrec reads version {BUNDLE_FORMAT_VERSION})")
    if manifest.get("feature_schema_version") != SCHEMA_VERSION:
        raise BundleError(f"{path}: feature schema version {manifest.get('feature_schema_version')!r} differs from "
                          f"this dinrec's {SCHEMA_VERSION}")
    return manifest


def listed_files(manifest: dict) -> dict[str, str]:
    """The manifest's files (name → sha256), each a plain file name: a name that could reach outside
    the bundle's folder (a separator, ``..``, a dotfile, empty) makes the whole manifest invalid."""
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise BundleError("the manifest lists no files")
    for name, digest in files.items():
        if (not isinstance(name, str) or not name or len(name) > 255 or name.startswith(".") or "/" in name
                or "\\" in name or "\0" in name or name == MANIFEST_FILE or not isinstance(digest, str)):
            raise BundleError(f"the manifest lists {name!r}: not a plain file name of the bundle")
    return files


def verify_bundle(path: str | Path) -> dict:
    """Check every file against the manifest — each listed file present with its checksum, no file the
    manifest does not list (each file a load opens is verified) —; return the manifest."""
    path = Path(path)
    manifest = read_manifest(path)
    files = listed_files(manifest)
    unlisted = sorted(p.name for p in path.iterdir() if p.name != MANIFEST_FILE and p.name not in files)
    if unlisted:
        raise BundleError(f"{path}: {', '.join(unlisted[:5])} not listed in the manifest; the bundle was modified")
    if "towers.safetensors" in files and "towers_config.json" not in files:
        raise BundleError(f"{path}: manifest lists towers.safetensors without towers_config.json")
    for name, expected in files.items():
        f = path / name
        if not f.is_file():
            raise BundleError(f"{path}: {name} is listed in the manifest but missing")
        if file_sha256(f) != expected:
            raise BundleError(f"{path}: checksum mismatch for {name}; the bundle was modified or corrupted")
    for required in ("model.safetensors", "model_config.json", "vocab.json", "metrics.json", "popularity.json"):
        if required not in manifest.get("files", {}):
            raise BundleError(f"{path}: manifest lists no {required}")
    return manifest


def load_bundle(path: str | Path) -> Bundle:
    path = Path(path)
    manifest = verify_bundle(path)
    try:
        config = DINConfig.from_json(json.loads((path / "model_config.json").read_text()))
        vocab = Vocab.from_json(json.loads((path / "vocab.json").read_text()))
        model = DIN(config)
        model.load_state_dict(load_file(str(path / "model.safetensors")))
        towers = None
        if "towers.safetensors" in manifest["files"]:
            towers = Towers(TowersConfig.from_json(json.loads((path / "towers_config.json").read_text())))
            towers.load_state_dict(load_file(str(path / "towers.safetensors")))
            towers.eval()
        item_counts = np.load(path / ITEM_COUNTS_FILE) if ITEM_COUNTS_FILE in manifest["files"] else None
        covisit = CoVisitation.load(path / COVISIT_FILE) if COVISIT_FILE in manifest["files"] else None
        blend = (Blend.from_json(json.loads((path / BLEND_FILE).read_text()))
                 if BLEND_FILE in manifest["files"] else None)
        if blend is not None and (covisit is None or item_counts is None or towers is None):
            raise ValueError(f"{BLEND_FILE} needs {COVISIT_FILE}, {ITEM_COUNTS_FILE} and the towers beside it")
        if covisit is not None and covisit.n_items != config.n_items:
            raise ValueError(f"{COVISIT_FILE} covers {covisit.n_items} items, the model {config.n_items}")
        if config.pair_inputs and covisit is None:
            raise ValueError(f"its DIN reads co-visitation similarities and there is no {COVISIT_FILE}")
        if config.candidate_inputs and item_counts is None:
            raise ValueError(f"its DIN reads training counts and there is no {ITEM_COUNTS_FILE}")
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise BundleError(f"{path}: cannot build the model from the bundle: {exc}") from exc
    model.eval()
    popularity = [(str(i), float(c)) for i, c in json.loads((path / "popularity.json").read_text())]
    return Bundle(path=path, manifest=manifest, config=config, vocab=vocab,
                  metrics=json.loads((path / "metrics.json").read_text()), popularity=popularity, model=model,
                  towers=towers, item_counts=item_counts, covisit=covisit, blend=blend)
