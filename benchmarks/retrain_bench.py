"""`dinrec bench retrain`: what a scheduled retrain buys, and whether its gate tells good from bad.

A dataset's log is published and archived (streams.archive, the path production takes), then
``dinrec retrain``'s job runs on it as a scheduler would:

1. at the ``cut`` quantile of time (aligned to the hour): the first model, which becomes champion;
2. at the end of the log: the candidate, **warm-started** from the champion, against the champion on
   the behaviours after the cut (the gate's holdout) — the stale champion is what serving would keep
   without retraining;
3. the peers, in the same run and window, from the same champion state: the candidate trained **from
   scratch** (``warm_start=False``), and with the recall towers warm-started too
   (``warm_start_towers=True``; by default only DIN is) — their times and holdout metrics beside the
   default's;
4. the gate drills (shuffled labels, miscalibrated logits): each must be refused.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from dinrec.datasets import load_dataset
from dinrec.registry.store import Registry
from dinrec.retrain.job import RetrainJob
from dinrec.retrain.settings import RetrainSettings
from dinrec.streams.archive import archive_events
from dinrec.training.progress import Stages, showing
from dinrec.training.settings import TrainSettings

KEEP = ("auc", "gauc", "logloss", "calibration_error", "recall_hr", "recall_tail_share", "recall_tail_hr",
        "tail_positives", "users")


def _archive(data_dir: Path, root: Path) -> tuple[int, np.ndarray]:
    data = load_dataset(data_dir)
    stats = archive_events(list(data.events()), root, max_file_records=50_000)
    return stats.records, data.behaviours().ts


def _run(root: Path, name: str, until: float, train: TrainSettings, drill: str | None = None,
         **settings) -> tuple[dict, float]:
    """One retrain on its own copy of the registry as it stood after the first model (unless ``name`` is
    "first"), with its own work folder."""
    registry = root / f"registry-{name}"
    if name != "first":
        shutil.copytree(root / "registry-first", registry)
    s = RetrainSettings(archive_dir=str(root / "archive"), registry=str(registry), work_dir=root / f"work-{name}",
                        history_days=3650, min_holdout_users=10, **settings)
    t0 = time.perf_counter()
    outcome = RetrainJob(s, train, until=until, drill=drill).run()
    return outcome.report, time.perf_counter() - t0


def _holdout(report: dict, who: str) -> dict:
    h = (report.get(who) or {}).get("holdout") or {}
    return {k: h.get(k) for k in KEEP}


def bench_retrain(data_dir: Path, cut: float = 0.8, epochs: int = 2, recall_epochs: int = 10,
                  seq_len: int = 50, seed: int = 0, progress: bool | None = None) -> dict:
    """``progress``: a line per retrain on stderr (default: when stderr is a terminal)."""
    say = Stages(showing(progress))
    train = TrainSettings(epochs=epochs, recall_epochs=recall_epochs, seq_len=seq_len, seed=seed,
                          negative_power=1.0, progress=False)
    with tempfile.TemporaryDirectory(prefix="dinrec-bench-retrain-") as tmp:
        root = Path(tmp)
        n_events, ts = _archive(data_dir, root / "archive")
        say(f"{n_events} events archived")
        cut_ts = float(np.quantile(ts, cut)) // 3600 * 3600
        end = (float(ts.max()) // 3600 + 1) * 3600
        first, first_s = _run(root, "first", cut_ts, train)
        say(f"first model: {first['status']} ({first_s:.1f} s)")
        if first["status"] != "promoted":
            return {"dataset": str(data_dir), "error": f"no first model: {first.get('reason')}"}
        warm, warm_s = _run(root, "warm", end, train)
        say(f"warm retrain: {warm['status']} ({warm_s:.1f} s, holdout gauc {_holdout(warm, 'candidate')['gauc']})")
        cold, cold_s = _run(root, "cold", end, train, warm_start=False)
        say(f"cold peer: {cold['status']} ({cold_s:.1f} s, holdout gauc {_holdout(cold, 'candidate')['gauc']})")
        towers, towers_s = _run(root, "warm-towers", end, train, warm_start_towers=True)
        say(f"warm-towers peer: {towers['status']} ({towers_s:.1f} s)")
        drills = {}
        for drill in ("shuffled-labels", "miscalibrated"):
            report, _ = _run(root, drill, end, train, drill=drill)
            drills[drill] = {"status": report["status"], "exit_code": report["exit_code"],
                             "failed": [c["metric"] for c in report.get("checks", []) if not c["passed"]],
                             "candidate": _holdout(report, "candidate")}
            say(f"{drill} drill: {report['status']}")
        promoted_to = Registry(root / "registry-warm").resolve("champion")
    return {
        "dataset": str(data_dir), "events": n_events, "cut_quantile": cut, "window_end": end, "cut": cut_ts,
        "first_model": {"status": first["status"], "seconds": round(first_s, 1),
                        "behaviours": first["data"]["behaviours"]},
        "retrain": {"status": warm["status"], "exit_code": warm["exit_code"], "reason": warm.get("reason"),
                    "new_behaviours": warm["data"]["new_behaviours"], "holdout_users": warm["data"]["holdout_users"],
                    "seconds": round(warm_s, 1)},
        "stale_champion": _holdout(warm, "champion"),
        "warm_candidate": _holdout(warm, "candidate"),
        "peer_cold_candidate": {**_holdout(cold, "candidate"), "status": cold["status"], "seconds": round(cold_s, 1)},
        "peer_warm_towers_candidate": {**_holdout(towers, "candidate"), "status": towers["status"],
                                       "reason": towers.get("reason"), "seconds": round(towers_s, 1)},
        "warm_vs_cold": {"seconds_ratio": round(warm_s / cold_s, 3) if cold_s else None,
                         "gauc_delta": _delta(warm, cold, "gauc"), "recall_hr_delta": _delta(warm, cold, "recall_hr")},
        "retrain_vs_stale": {"gauc_delta": _delta(warm, warm, "gauc", "champion"),
                             "recall_hr_delta": _delta(warm, warm, "recall_hr", "champion")},
        "drills": drills,
        "champion_after_retrain": promoted_to,
    }


def _delta(a: dict, b: dict, metric: str, b_who: str = "candidate") -> float | None:
    x, y = _holdout(a, "candidate").get(metric), _holdout(b, b_who).get(metric)
    return round(x - y, 4) if x is not None and y is not None else None
