"""Library peers for ``dinrec bench e2e``: what a team would pick instead of dinrec, run as their authors
ship them on the bench's own split.

RecTools' SASRec, BERT4Rec (softmax loss over the catalog) and EASE run in an environment of their own
(``make peers``: RecTools pins numpy below 2, dinrec's environment has 2), driven through files by
``rectools_peer.py``; the peers' torch is dinrec's (the environment reads dinrec's site-packages after its
own). Where that environment is missing a peer is reported as skipped, with the command that makes it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import numpy as np

from dinrec.training.samples import SampleSet, training_ends

RUNNER = Path(__file__).with_name("rectools_peer.py")
PEERS_PYTHON_ENV = "DINREC_PEERS_PYTHON"

# The bench's name for each peer → the runner's model.
LIBRARY_PEERS = {"sasrec_rectools": "sasrec", "bert4rec_rectools": "bert4rec", "ease_rectools": "ease"}


class PeerUnavailable(RuntimeError):
    """The peers' environment is not there (or cannot import the library)."""


def peers_python() -> Path:
    """The interpreter of the peers' environment: ``DINREC_PEERS_PYTHON``, else the one ``make peers``
    builds beside dinrec's own (``<venv>-peers``)."""
    explicit = os.environ.get(PEERS_PYTHON_ENV)
    python = Path(explicit) if explicit else Path(f"{sys.prefix}-peers") / "bin" / "python"
    if not python.is_file():
        raise PeerUnavailable(f"no peers environment at {python}: run `make peers` (or set {PEERS_PYTHON_ENV})")
    return python


@dataclass(frozen=True)
class PeerRun:
    lists: np.ndarray  # (n_test, k) item indices, best first; -1 where fewer
    info: dict  # library, settings, epochs, seconds


class _Inputs(TypedDict):
    """What :func:`_inputs` writes for the runner, one array a name (``rectools_peer.py`` reads them)."""
    fit_user: np.ndarray
    fit_item: np.ndarray
    fit_ts: np.ndarray
    fit_is_val: np.ndarray
    ask_user: np.ndarray
    ask_item: np.ndarray
    ask_ts: np.ndarray
    test_user: np.ndarray
    val_user: np.ndarray
    val_target: np.ndarray


def _inputs(samples: SampleSet, test_rows: np.ndarray) -> _Inputs:
    """The split as the runner takes it: training behaviours and validation targets to fit on, each test
    user's behaviours before their target to recommend from (user and item ids: the samples' indices)."""
    starts, ends = samples.user_offsets[:-1], training_ends(samples)
    lengths = ends - starts
    users = np.repeat(np.arange(len(starts)), lengths)
    positions = np.concatenate([np.arange(a, b) for a, b in zip(starts.tolist(), ends.tolist(), strict=True)])
    val = samples.val
    vrows = np.flatnonzero(val.label == 1)
    val_pos = val.hist_end[vrows]  # the validation target's own position (its group starts there)
    fit_user = np.r_[users, val.user[vrows]]
    fit_item = np.r_[samples.seq_items[positions], val.target_item[vrows]]
    fit_ts = np.r_[samples.seq_ts[positions], samples.seq_ts[val_pos]]
    test = samples.test
    spans = [samples.before(test, r) for r in test_rows.tolist()]
    ask_user = np.concatenate([np.full(s.stop - s.start, test.user[r]) for s, r in zip(spans, test_rows.tolist(),
                                                                                         strict=True)])
    ask_pos = np.concatenate([np.arange(s.start, s.stop) for s in spans])
    is_val = np.r_[np.zeros(len(users), bool), np.ones(len(vrows), bool)]
    return {"fit_user": fit_user.astype(np.int64), "fit_item": fit_item.astype(np.int64),
            "fit_ts": fit_ts.astype(np.float64), "fit_is_val": is_val,
            "ask_user": ask_user.astype(np.int64), "ask_item": samples.seq_items[ask_pos].astype(np.int64),
            "ask_ts": samples.seq_ts[ask_pos].astype(np.float64), "test_user": test.user[test_rows].astype(np.int64),
            "val_user": val.user[vrows].astype(np.int64), "val_target": val.target_item[vrows].astype(np.int64)}


def run_library_peer(name: str, samples: SampleSet, test_rows: np.ndarray, k: int, seed: int,
                     params: dict | None = None, timeout_s: float = 3600) -> PeerRun:
    """Fit the peer ``name`` (:data:`LIBRARY_PEERS`) on ``samples``' training behaviours (its validation
    targets for early stopping) and recommend ``k`` items to each test row's user from everything they did
    before the target, what they took excluded."""
    python = peers_python()
    config = {"model": LIBRARY_PEERS[name], "k": k, "seed": seed, "threads": max(1, os.cpu_count() or 1),
              "params": params or {}}
    with tempfile.TemporaryDirectory(prefix="dinrec-peer-") as tmp:
        inp, out = Path(tmp) / "in.npz", Path(tmp) / "out.npz"
        np.savez(inp, **_inputs(samples, test_rows),
                 config=np.frombuffer(json.dumps(config).encode(), dtype=np.uint8))
        t0 = time.perf_counter()
        done = subprocess.run([str(python), str(RUNNER), str(inp), str(out)], capture_output=True, text=True,
                              timeout=timeout_s, env={**os.environ, "PYTHONHASHSEED": "0"})
        if done.returncode != 0:
            tail = done.stderr.strip()[-2000:]
            if "ModuleNotFoundError" in tail:
                raise PeerUnavailable(f"{name}: the peers environment cannot import its library ({tail[-300:]}); "
                                      "run `make peers`")
            raise RuntimeError(f"{name} failed (exit {done.returncode}): {tail}")
        with np.load(out, allow_pickle=False) as f:
            lists, info = f["lists"], json.loads(bytes(f["info"]).decode())
    info["seconds"] = round(time.perf_counter() - t0, 1)
    return PeerRun(lists, info)
