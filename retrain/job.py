"""`dinrec retrain`: one run of the job a scheduler starts.

    lock → window → samples → train (warm start, checkpoints) → candidate bundle (DIN + towers)
         → champion vs candidate on one holdout → gate → publish → roll out → report

* **Window**: ``[end − history_days, end)`` with ``end`` the latest multiple of ``align_s`` (or
  ``--until``). Everything a run makes lives in ``{work_dir}/runs/{run id}/`` — the id is the window
  plus a hash of the training settings — so a rerun of the same window is a no-op that replays the
  report (idempotent), and a killed run resumes where it stopped: the samples it built, its DIN
  checkpoints (exact resume), its exported candidate, its publish.
* **Nothing new**: fewer than ``min_new_events`` behaviours after the champion's window, or fewer
  than ``min_holdout_users`` users to compare on: the champion stays, exit 0.
* **Gate** (retrain.gate): refused → the candidate is still published (inspectable,
  promotable by hand) but no alias moves; exit 3 with the reasons in the report.
* **Rollout**: ``champion`` moves the alias (replicas hot-reload it); ``challenger`` moves the
  challenger alias and starts an A/B experiment that the guardrail can stop and a win promotes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np

from dinrec.models.bundle import Bundle, code_version, load_bundle
from dinrec.registry.store import ANY, AliasConflict, UnknownAlias, open_registry
from dinrec.retrain.drills import DRILLS, degrade_model, degrade_samples
from dinrec.retrain.events import read_window
from dinrec.retrain.gate import checks_json, decide
from dinrec.retrain.settings import RetrainSettings
from dinrec.retrain.spot import SpotFailed, train_on_spot
from dinrec.spot.protocol import EXIT_INTERRUPTED
from dinrec.storage import Lease, LeaseHeld, LeaseLost, LocalStorage, folder_written_atomically
from dinrec.training.evaluation import baseline_differences, baselines, holdout_rows, measure, paired_differences
from dinrec.training.pipeline import samples_for
from dinrec.training.samples import SampleSet, is_sample_dir
from dinrec.training.settings import TrainSettings

log = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_REFUSED, EXIT_LOCKED, EXIT_DRILL_UNCAUGHT = 0, 1, 2, 3, 4, 5
LEASE_KEY = "leases/retrain.json"  # in the registry: every run that could move its aliases takes turns

# What changes the model a window yields: a run under other values is another run.
_RUN_KEYS = ("epochs", "batch_size", "lr", "seq_len", "negatives", "eval_negatives", "negative_power", "item_dim",
             "cat_dim", "mlp_hidden", "attention_hidden", "seed", "recall_epochs", "recall_dim")


class EmptyWindow(Exception):
    """The window holds no behaviour at all: nothing to retrain on (skipped, exit 0), not bad input."""

    def __init__(self, message: str, stats: dict) -> None:
        super().__init__(message)
        self.stats = stats


@dataclass
class Outcome:
    status: str  # promoted | refused | skipped | locked | interrupted | failed | drill-passed
    exit_code: int
    report: dict


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y%m%dT%H%M%SZ")


class RetrainJob:
    def __init__(self, settings: RetrainSettings, train: TrainSettings, *, until: float | None = None,
                 stop: threading.Event | None = None, drill: str | None = None, spot: bool = False) -> None:
        """``drill``: inject a fault (retrain.drills); the candidate never ships. ``spot``: train
        the candidate as a spot job (retrain.spot)."""
        if drill is not None and drill not in DRILLS:
            raise ValueError(f"unknown drill {drill!r}: use one of {', '.join(DRILLS)}")
        if drill and spot:
            raise ValueError("gate drills run locally: drop --spot")
        if spot:  # a job runs one rank per GPU and resumes on as many: its candidate types must agree
            from dinrec.spot.wiring import same_rank_count

            same_rank_count(settings.spot_instance_types, "gpus")
        if settings.registry is None:
            raise ValueError("retrain publishes its candidates to a registry: set DINREC_REGISTRY (or --registry)")
        self.s, self.train_settings = settings, train  # its progress: DINREC_TRAIN_PROGRESS, else a terminal's
        self.drill, self.spot = drill, spot
        self.stop = stop or threading.Event()
        self.end = until if until is not None else (time.time() // settings.align_s) * settings.align_s
        self.start = self.end - settings.history_days * 86_400
        cfg = json.dumps({**{k: getattr(self.train_settings, k) for k in _RUN_KEYS}, "drill": drill},
                         sort_keys=True, default=str)
        self.run_id = f"{_iso(self.start)}_{_iso(self.end)}_{hashlib.sha256(cfg.encode()).hexdigest()[:8]}"
        self.run_dir = settings.work_dir / "runs" / self.run_id
        self.files = LocalStorage(self.run_dir)  # the run's JSON documents, each written whole
        self.registry = open_registry(settings.registry, settings.registry_cache)

    # ------------------------------------------------------------------ the run
    def run(self) -> Outcome:
        """One run at a time per registry (the lease; another run holding it: exit 4 at once)."""
        self.lease = Lease(self.registry.storage, LEASE_KEY, ttl_s=self.s.lease_s)
        try:
            with self.lease:
                return self._run_locked()
        except LeaseHeld as exc:
            why = f"another retrain holds the lease: {exc}"
            return Outcome("locked", EXIT_LOCKED, {"status": "locked", "reason": why, "holder": exc.holder})

    def _run_locked(self) -> Outcome:
        t0 = time.time()
        decided = self.files.get_json("report.json")
        if decided is not None:  # this window was decided: say so again, change nothing
            report = {**decided, "replayed": True}
            return Outcome(report["status"], report["exit_code"], report)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        champion_version, champion = self._champion()
        since = (champion.manifest.get("lineage") or {}).get("data_window", {}).get("end") if champion else None
        report: dict = {"run": self.run_id, "window": {"start": self.start, "end": self.end,
                                                       "start_iso": _iso(self.start), "end_iso": _iso(self.end)},
                        "champion": {"version": champion_version, "data_end": since},
                        "code_version": code_version(), "rollout": self.s.rollout, "drill": self.drill}
        if champion is not None and since is None:
            report["warning"] = ("the champion records no data window: the holdout may include behaviours it was "
                                 "trained on, which favours keeping it")
        try:
            samples, data_stats = self._samples()
        except EmptyWindow as exc:  # a new deployment's first runs: nothing archived yet
            report.update({"data": exc.stats, "reason": f"nothing to retrain on: {exc}"})
            return self._finish(report, "skipped", EXIT_OK, t0)
        report["data"] = data_stats
        new = int((samples.seq_ts >= since).sum()) if since is not None else len(samples.seq_ts)
        rows = holdout_rows(samples, since, self._attributed() if self.s.holdout == "organic" else ())
        holdout_users = len(np.unique(samples.test.user[rows]))
        report["data"].update({"new_behaviours": new, "holdout": self.s.holdout, "holdout_rows": int(len(rows)),
                               "holdout_users": holdout_users})
        if new < self.s.min_new_events or holdout_users < self.s.min_holdout_users:
            report["reason"] = (f"nothing to retrain on: {new} new behaviours (need {self.s.min_new_events}), "
                                f"{holdout_users} holdout users (need {self.s.min_holdout_users})")
            return self._finish(report, "skipped", EXIT_OK, t0)

        try:
            candidate = self._candidate(samples, champion, champion_version, data_stats)
        except SpotFailed as exc:  # no candidate; the champion keeps serving. Rerun: a new window or job
            report.update({"spot": exc.report, "reason": f"{exc}; the champion keeps serving"})
            return Outcome("failed", EXIT_FAILED, {**report, "status": "failed", "exit_code": EXIT_FAILED})
        if candidate is None:
            return Outcome("interrupted", EXIT_INTERRUPTED, {**report, "status": "interrupted",
                                                             "reason": "stopped; rerun to resume this window"})
        report["candidate"] = {"version": candidate.model_version, "train": _train_summary(candidate.metrics)}
        spot = self.files.get_json("spot-report.json")
        if spot is not None:
            report["candidate"]["spot"] = spot
        cand_units, champ_units = {}, {}
        report["candidate"]["holdout"] = measure(candidate, samples, rows, self.s.recall_k, units=cand_units)
        if champion is not None:
            report["champion"]["holdout"] = measure(champion, samples, rows, self.s.recall_k, units=champ_units)
        report["baselines"], baseline_hits = baselines(samples, rows)
        differences = paired_differences(cand_units, champ_units)
        differences.update({f"served_hr_vs_{name}": d  # candidate − baseline, paired over the same behaviours
                            for name, d in baseline_differences(cand_units["served_hr"], baseline_hits).items()})
        promote, checks = decide(report["candidate"]["holdout"], report["champion"].get("holdout"), self.s,
                                 differences, report["baselines"])
        report["checks"] = checks_json(checks)
        failures = "; ".join(c.why() for c in checks if not c.passed)
        if self.drill:  # a drill candidate never ships, whatever the gate says
            if promote:
                report["reason"] = f"drill {self.drill}: the gate PASSED a deliberately degraded candidate"
                return self._finish(report, "drill-passed", EXIT_DRILL_UNCAUGHT, t0)
            report["reason"] = f"drill {self.drill}: refused as it should be: {failures}"
            return self._finish(report, "refused", EXIT_REFUSED, t0)
        self._publish(candidate)
        self._record_evaluation(candidate.model_version, report, differences, promote)
        if not promote:
            worse_than = sorted({"the baselines" if c.metric.startswith("served_hr_vs_") else "the champion"
                                 for c in checks if not c.passed})
            report["reason"] = f"the candidate is worse than {' and '.join(worse_than)}: {failures}"
            return self._finish(report, "refused", EXIT_REFUSED, t0)
        try:
            self.lease.check()  # a run that stalled past its lease may have been overtaken: it moves nothing
        except LeaseLost as exc:
            report["reason"] = f"passed the gate, but this run lost its lease: not rolled out: {exc}"
            return self._finish(report, "locked", EXIT_LOCKED, t0)
        try:
            report["rolled_out"] = self._roll_out(candidate.model_version, champion_version)
        except AliasConflict as exc:  # the champion moved (a rollback, an A/B winner) while this one was gated
            report["reason"] = (f"passed the gate against champion {champion_version}, which is no longer the "
                                f"champion: not rolled out (the next run gates against the new one): {exc}")
            return self._finish(report, "refused", EXIT_REFUSED, t0)
        report["reason"] = "passed the gate" + ("" if champion else " (first model: no champion to compare with)")
        return self._finish(report, "promoted", EXIT_OK, t0)

    def _finish(self, report: dict, status: str, code: int, t0: float) -> Outcome:
        report.update({"status": status, "exit_code": code, "seconds": round(time.time() - t0, 1)})
        self.files.put_json("report.json", report)  # last: its presence means this window is decided
        LocalStorage(self.s.work_dir).put_json("latest.json", report)
        return Outcome(status, code, report)

    # ------------------------------------------------------------------ stages
    def _champion(self) -> tuple[str | None, Bundle | None]:
        try:
            version = self.registry.resolve("champion")
        except UnknownAlias:  # the first model; a registry that cannot be read is an outage, raised
            return None, None
        return version, load_bundle(self.registry.bundle_dir(version))

    def _samples(self) -> tuple[SampleSet, dict]:
        """The window's point-in-time samples: built once per run, then reused (a resume trains on
        exactly what the first attempt did, whatever arrived since)."""
        folder, stats = self.run_dir / "samples", self.files.get_json("data.json")
        if is_sample_dir(folder) and stats is not None:
            return SampleSet.load(folder), stats
        # The attributed clicks first: data.json, written last, is what marks the samples complete.
        window = read_window(self.s.archive_dir, self.s.topic, self.start, self.end, late_s=self.s.late_s)
        if window.stats["behaviours"] == 0:
            raise EmptyWindow(f"the archive holds no behaviours in the window ({window.stats['events']} events)",
                              window.stats)
        samples = samples_for(window.data, self.train_settings)
        stats = {**window.stats, "fingerprint": samples.fingerprint, "users": len(samples.users),
                 "items": samples.vocab.n_items - 1, "categories": samples.vocab.n_categories - 1}
        self.files.put_json("attributed.json", {"attributed": window.attributed})
        with folder_written_atomically(folder) as tmp:
            samples.save(tmp)
        self.files.put_json("data.json", stats)
        return samples, stats

    def _attributed(self) -> list[tuple[str, str, float]]:
        rows = self.files.get_json("attributed.json")["attributed"]
        return [(u, i, float(t)) for u, i, t in rows]

    def _candidate(self, samples: SampleSet, champion: Bundle | None, parent: str | None,
                   data_stats: dict) -> Bundle | None:
        """Train DIN (resuming from this run's checkpoints) and the recall towers, warm-started from
        the champion, and export them as one bundle; None when stopped first."""
        from dinrec.training.checkpoint import open_checkpoint_store
        from dinrec.training.loop import TrainingInterrupted
        from dinrec.training.pipeline import train_bundle
        from dinrec.training.progress import Stages, showing

        out = self.run_dir / "candidate"
        if (out / "manifest.json").is_file():
            return load_bundle(out)
        use = champion if self.s.warm_start else None
        lineage = {"trained_by": "dinrec retrain" + (" --spot" if self.spot else ""), "run": self.run_id,
                   "parent": parent, "warm_start": use is not None,
                   "warm_start_towers": use is not None and self.s.warm_start_towers,
                   "data_window": {"start": self.start, "end": self.end, "archive": str(self.s.archive_dir),
                                   "topic": self.s.topic, **data_stats}}
        if self.spot:
            bundle, cost = train_on_spot(self.run_dir, self.run_dir / "samples", use, self.train_settings,
                                         self.s.spot_instance_types, lineage, towers=self.s.warm_start_towers)
            self.files.put_json("spot-report.json", cost)
            return bundle
        store = open_checkpoint_store(self.run_dir / "checkpoints", keep=self.train_settings.keep_checkpoints)
        resumed_from = store.latest()
        samples = degrade_samples(samples, self.drill, self.train_settings.seed)

        def drilled(result) -> bool:  # the drill degrades DIN after training; a stop now exports nothing
            degrade_model(result.model, self.drill)
            result.metrics["resumed_from"] = resumed_from
            return not self.stop.is_set()

        say = Stages(showing(self.train_settings.progress))  # as `dinrec train`: on a terminal, on stderr
        say(f"retrain {self.run_id}: {len(samples.train.label):,} training samples, the candidate next")
        try:
            trained = train_bundle(samples, self.train_settings, out, checkpoints=store, resume="auto",
                                   stop=self.stop, champion=use, warm_towers=self.s.warm_start_towers,
                                   lineage=lineage, after_training=drilled, say=say)
        except TrainingInterrupted:
            return None
        return None if trained.bundle is None else load_bundle(trained.bundle)

    def _publish(self, candidate: Bundle) -> None:
        if candidate.model_version not in self.registry.versions():  # a resumed run may have published it
            self.registry.publish(candidate.path)

    def _record_evaluation(self, version: str, report: dict, differences: dict, promote: bool) -> None:
        """Beside the version in the registry, what this gate measured of it: ``dinrec models describe``
        shows the served list against champion and baselines without the run's work folder."""
        champion = report["champion"]
        versus = {"champion": differences.get("served_hr")} if champion.get("holdout") else {}
        versus.update({name: differences.get(f"served_hr_vs_{name}") for name in report["baselines"]})
        self.registry.record_evaluation(version, self.run_id, {
            "run": self.run_id, "window": report["window"], "holdout": report["data"].get("holdout"),
            "holdout_users": report["data"].get("holdout_users"), "decision": "promoted" if promote else "refused",
            "served_hr": report["candidate"]["holdout"].get("served_hr"),
            "champion": {"version": champion.get("version"),
                         "served_hr": (champion.get("holdout") or {}).get("served_hr")},
            "baselines": {name: b.get("served_hr") for name, b in report["baselines"].items()},
            "candidate_minus": versus,  # {"difference", "se"} per comparison, paired over the same behaviours
            "failed_checks": [c["metric"] for c in report["checks"] if not c["passed"]]})

    def _roll_out(self, version: str, champion: str | None) -> dict:
        """Move the alias; the champion only if it is still the one the candidate was gated against."""
        reason = f"retrain {self.run_id}: passed the gate"
        if self.s.rollout == "champion":
            self._move("champion", version, reason, expected=champion)
            return {"alias": "champion", "version": version}
        self._move("challenger", version, reason)
        from dinrec.retrain.rollout import start_challenger_experiment

        name = start_challenger_experiment(self.s, version)
        return {"alias": "challenger", "version": version, "experiment": name}

    def _move(self, alias: str, version: str, reason: str, expected: str | None = ANY) -> None:
        try:
            if self.registry.resolve(alias) == version:
                return  # a resumed run that already moved it
        except UnknownAlias:
            pass
        self.registry.set_alias(alias, version, reason=reason, expected=expected)


def _train_summary(metrics: dict) -> dict:
    keep = ("test_auc", "test_gauc", "test_logloss", "best_epoch", "global_step", "samples_per_s", "train_samples",
            "seq_len", "resumed_from", "warm_start")
    out = {k: metrics.get(k) for k in keep}
    recall = metrics.get("recall") or {}
    out["recall_test_hr"] = recall.get("test_hr")
    out["recall_warm_start"] = recall.get("warm_start")
    return out
