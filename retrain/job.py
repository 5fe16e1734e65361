"""`dinrec retrain`: one run of the job a scheduler starts.

    lock → window (samples, holdout) → train (a candidate bundle: DIN + towers, warm start, checkpoints)
         → measure (candidate, champion and baselines on one holdout) → gate → publish → roll out → report

Each stage (``RetrainJob._stages``) hands the next what it needs or ends the run with a typed
:class:`Stop`; the run has one exit, which completes the :class:`RetrainReport` and keeps it.

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
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from enum import StrEnum

import numpy as np

from dinrec.models.bundle import Bundle, code_version, load_bundle
from dinrec.registry.store import ANY, AliasConflict, UnknownAlias, open_registry
from dinrec.retrain.drills import DRILLS, degrade_model, degrade_samples
from dinrec.retrain.events import read_window
from dinrec.retrain.gate import Check, checks_json, decide
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


class Status(StrEnum):
    PROMOTED = "promoted"
    REFUSED = "refused"
    SKIPPED = "skipped"
    LOCKED = "locked"
    INTERRUPTED = "interrupted"
    FAILED = "failed"
    DRILL_PASSED = "drill-passed"


@dataclass(frozen=True)
class Stop:
    """How a run ends: the verdict of the stage that ended it. ``decided``: the window is decided, its
    report is kept as ``report.json`` and a rerun replays it; otherwise (stopped, a failed spot job) a
    rerun of the window resumes or retries it."""

    status: Status
    exit_code: int
    reason: str
    decided: bool = True


@dataclass
class Champion:
    version: str | None
    data_end: float | None  # the end of its training window: the holdout starts there
    holdout: dict | None = None  # training.evaluation.measure on the run's holdout


@dataclass
class Candidate:
    version: str
    train: dict  # _train_summary of its metrics
    spot: dict | None = None  # the spot job's cost report, when it trained on one
    holdout: dict | None = None


@dataclass
class RetrainReport:
    """What a run did, stage by stage: printed as one JSON object and kept in the run's folder."""

    run: str
    start: float
    end: float
    champion: Champion
    code_version: str
    rollout: str
    drill: str | None
    warning: str | None = None
    data: dict | None = None  # the window's counts (retrain.events), then the holdout's
    spot: dict | None = None  # a spot job that failed: its own report
    candidate: Candidate | None = None
    baselines: dict | None = None  # training.evaluation.baselines: the served lists a candidate must hold against
    checks: list[dict] | None = None  # retrain.gate.checks_json: every check, passed or not
    rolled_out: dict | None = None
    status: Status | None = None
    exit_code: int | None = None
    reason: str | None = None
    seconds: float | None = None

    def to_json(self) -> dict:
        """The report's document; a part no stage reached is left out."""
        out: dict = {"run": self.run, "window": {"start": self.start, "end": self.end, "start_iso": _iso(self.start),
                                                 "end_iso": _iso(self.end)},
                     "champion": _without_none(asdict(self.champion), keep=("version", "data_end")),
                     "code_version": self.code_version, "rollout": self.rollout, "drill": self.drill}
        if self.candidate is not None:
            out["candidate"] = _without_none(asdict(self.candidate), keep=("version", "train"))
        optional = {"warning": self.warning, "data": self.data, "spot": self.spot, "baselines": self.baselines,
                    "checks": self.checks, "rolled_out": self.rolled_out, "seconds": self.seconds}
        out.update({k: v for k, v in optional.items() if v is not None})
        out.update({"status": None if self.status is None else str(self.status), "exit_code": self.exit_code,
                    "reason": self.reason})
        return out


def _without_none(part: dict, keep: tuple[str, ...]) -> dict:
    return {k: v for k, v in part.items() if v is not None or k in keep}


@dataclass
class Outcome:
    status: str  # a Status, or "locked" before the run began
    exit_code: int
    report: dict  # the report's document (RetrainReport.to_json)


@dataclass(frozen=True)
class _Window:
    """The window's samples and the holdout the candidate and the champion are compared on."""

    samples: SampleSet
    rows: np.ndarray  # test-split rows of the holdout


@dataclass(frozen=True)
class _Verdict:
    promote: bool
    failures: str  # the failed checks' reasons, "; "-joined
    checks: list[Check]
    differences: dict[str, dict]  # candidate − champion and − each baseline, paired (training.evaluation)


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
        self.lease = Lease(self.registry.storage, LEASE_KEY, ttl_s=self.s.lease_s)

    # ------------------------------------------------------------------ the run
    def run(self) -> Outcome:
        """One run at a time per registry (the lease; another run holding it: exit 4 at once)."""
        try:
            with self.lease:
                return self._run_locked()
        except LeaseHeld as exc:
            why = f"another retrain holds the lease: {exc}"
            return Outcome(Status.LOCKED, EXIT_LOCKED, {"status": Status.LOCKED, "reason": why, "holder": exc.holder})

    def _run_locked(self) -> Outcome:
        t0 = time.time()
        decided = self.files.get_json("report.json")
        if decided is not None:  # this window was decided: say so again, change nothing
            return Outcome(decided["status"], decided["exit_code"], {**decided, "replayed": True})
        self.run_dir.mkdir(parents=True, exist_ok=True)
        version, champion = self._champion()
        since = (champion.manifest.get("lineage") or {}).get("data_window", {}).get("end") if champion else None
        report = RetrainReport(self.run_id, self.start, self.end, Champion(version, since), code_version(),
                               self.s.rollout, self.drill)
        if champion is not None and since is None:
            report.warning = ("the champion records no data window: the holdout may include behaviours it was "
                              "trained on, which favours keeping it")
        stop = self._stages(report, champion)
        report.status, report.exit_code, report.reason = stop.status, stop.exit_code, stop.reason
        report.seconds = round(time.time() - t0, 1)
        document = report.to_json()
        if stop.decided:
            self.files.put_json("report.json", document)  # last: its presence means this window is decided
            LocalStorage(self.s.work_dir).put_json("latest.json", document)
        return Outcome(stop.status, stop.exit_code, document)

    def _stages(self, report: RetrainReport, champion: Bundle | None) -> Stop:
        """window → samples → candidate → measure → gate → publish → roll out: each stage goes on with what
        the next one needs, or ends the run with a :class:`Stop`."""
        window = self._window(report)
        if isinstance(window, Stop):
            return window
        candidate = self._train(report, window, champion)
        if isinstance(candidate, Stop):
            return candidate
        differences = self._measure(report, window, candidate, champion)
        verdict = self._gate(report, differences)
        if isinstance(verdict, Stop):
            return verdict
        published = self._publish(report, candidate, verdict)
        if isinstance(published, Stop):
            return published
        return self._roll_out(report, candidate)

    # ------------------------------------------------------------------ stages
    def _window(self, report: RetrainReport) -> _Window | Stop:
        """The window's samples and its holdout: enough that is new since the champion's window, or skipped."""
        try:
            samples, data_stats = self._samples()
        except EmptyWindow as exc:  # a new deployment's first runs: nothing archived yet
            report.data = exc.stats
            return Stop(Status.SKIPPED, EXIT_OK, f"nothing to retrain on: {exc}")
        since = report.champion.data_end
        new = int((samples.seq_ts >= since).sum()) if since is not None else len(samples.seq_ts)
        rows = holdout_rows(samples, since, self._attributed() if self.s.holdout == "organic" else ())
        holdout_users = len(np.unique(samples.test.user[rows]))
        report.data = {**data_stats, "new_behaviours": new, "holdout": self.s.holdout, "holdout_rows": int(len(rows)),
                       "holdout_users": holdout_users}
        if new < self.s.min_new_events or holdout_users < self.s.min_holdout_users:
            return Stop(Status.SKIPPED, EXIT_OK,
                        f"nothing to retrain on: {new} new behaviours (need {self.s.min_new_events}), "
                        f"{holdout_users} holdout users (need {self.s.min_holdout_users})")
        return _Window(samples, rows)

    def _train(self, report: RetrainReport, window: _Window, champion: Bundle | None) -> Bundle | Stop:
        try:
            assert report.data is not None  # the window stage counted it
            candidate = self._candidate(window.samples, champion, report.champion.version, report.data)
        except SpotFailed as exc:  # no candidate; the champion keeps serving. Rerun: a new window or job
            report.spot = exc.report
            return Stop(Status.FAILED, EXIT_FAILED, f"{exc}; the champion keeps serving", decided=False)
        if candidate is None:
            return Stop(Status.INTERRUPTED, EXIT_INTERRUPTED, "stopped; rerun to resume this window", decided=False)
        report.candidate = Candidate(candidate.model_version, _train_summary(candidate.metrics),
                                     spot=self.files.get_json("spot-report.json"))
        return candidate

    def _measure(self, report: RetrainReport, window: _Window, candidate: Bundle,
                 champion: Bundle | None) -> dict[str, dict]:
        """Candidate, champion and the baselines' served lists on the same holdout; returns the candidate's
        differences from the champion and from each baseline, paired over the holdout's units."""
        assert report.candidate is not None  # the train stage set it
        cand_units: dict = {}
        champ_units: dict = {}
        report.candidate.holdout = measure(candidate, window.samples, window.rows, self.s.recall_k, units=cand_units)
        if champion is not None:
            report.champion.holdout = measure(champion, window.samples, window.rows, self.s.recall_k,
                                              units=champ_units)
        report.baselines, baseline_hits = baselines(window.samples, window.rows)
        differences = paired_differences(cand_units, champ_units)
        differences.update({f"served_hr_vs_{name}": d  # candidate − baseline, paired over the same behaviours
                            for name, d in baseline_differences(cand_units["served_hr"], baseline_hits).items()})
        return differences

    def _gate(self, report: RetrainReport, differences: dict[str, dict]) -> _Verdict | Stop:
        """retrain.gate's checks; a drill's candidate ends here, whatever they say (it never ships)."""
        assert report.candidate is not None and report.candidate.holdout is not None
        promote, checks = decide(report.candidate.holdout, report.champion.holdout, self.s, differences,
                                 report.baselines)
        report.checks = checks_json(checks)
        failures = "; ".join(c.why() for c in checks if not c.passed)
        if self.drill and promote:
            return Stop(Status.DRILL_PASSED, EXIT_DRILL_UNCAUGHT,
                        f"drill {self.drill}: the gate PASSED a deliberately degraded candidate")
        if self.drill:
            return Stop(Status.REFUSED, EXIT_REFUSED, f"drill {self.drill}: refused as it should be: {failures}")
        return _Verdict(promote, failures, checks, differences)

    def _publish(self, report: RetrainReport, candidate: Bundle, verdict: _Verdict) -> None | Stop:
        """Published either way (a refused candidate stays inspectable, promotable by hand), with what the
        gate measured of it; a refused one moves no alias."""
        if candidate.model_version not in self.registry.versions():  # a resumed run may have published it
            self.registry.publish(candidate.path)
        self._record_evaluation(candidate.model_version, report, verdict)
        if verdict.promote:
            return None
        worse_than = sorted({"the baselines" if c.metric.startswith("served_hr_vs_") else "the champion"
                             for c in verdict.checks if not c.passed})
        return Stop(Status.REFUSED, EXIT_REFUSED,
                    f"the candidate is worse than {' and '.join(worse_than)}: {verdict.failures}")

    def _roll_out(self, report: RetrainReport, candidate: Bundle) -> Stop:
        """Move the alias; the champion only if it is still the one the candidate was gated against."""
        gated_against = report.champion.version
        try:
            self.lease.check()  # a run that stalled past its lease may have been overtaken: it moves nothing
        except LeaseLost as exc:
            return Stop(Status.LOCKED, EXIT_LOCKED, f"passed the gate, but this run lost its lease: not rolled out: "
                                                    f"{exc}")
        try:
            report.rolled_out = self._move_aliases(candidate.model_version, gated_against)
        except AliasConflict as exc:  # the champion moved (a rollback, an A/B winner) while this one was gated
            return Stop(Status.REFUSED, EXIT_REFUSED,
                        f"passed the gate against champion {gated_against}, which is no longer the champion: not "
                        f"rolled out (the next run gates against the new one): {exc}")
        return Stop(Status.PROMOTED, EXIT_OK,
                    "passed the gate" + ("" if gated_against else " (first model: no champion to compare with)"))

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
        written = self.files.get_json("attributed.json")  # written before data.json, which marks the samples
        if written is None:
            raise FileNotFoundError(f"{self.run_dir}/attributed.json is missing beside complete samples: remove "
                                    f"{self.run_dir} to rebuild the run")
        return [(u, i, float(t)) for u, i, t in written["attributed"]]

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

    def _record_evaluation(self, version: str, report: RetrainReport, verdict: _Verdict) -> None:
        """Beside the version in the registry, what this gate measured of it: ``dinrec models describe``
        shows the served list against champion and baselines without the run's work folder."""
        champion, data, differences = report.champion, report.data or {}, verdict.differences
        baselines_measured = report.baselines or {}
        versus = {"champion": differences.get("served_hr")} if champion.holdout else {}
        versus.update({name: differences.get(f"served_hr_vs_{name}") for name in baselines_measured})
        assert report.candidate is not None and report.candidate.holdout is not None  # measured before the gate
        self.registry.record_evaluation(version, self.run_id, {
            "run": self.run_id, "window": report.to_json()["window"], "holdout": data.get("holdout"),
            "holdout_users": data.get("holdout_users"), "decision": "promoted" if verdict.promote else "refused",
            "served_hr": report.candidate.holdout.get("served_hr"),
            "champion": {"version": champion.version, "served_hr": (champion.holdout or {}).get("served_hr")},
            "baselines": {name: b.get("served_hr") for name, b in baselines_measured.items()},
            "candidate_minus": versus,  # {"difference", "se"} per comparison, paired over the same behaviours
            "failed_checks": [c.metric for c in verdict.checks if not c.passed]})

    def _move_aliases(self, version: str, champion: str | None) -> dict:
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
