"""`dinrec retrain --spot`: the candidate is trained as a spot job (spot), not in this process.

The job's data is the run's sample set plus, for a warm start, the champion's bundle in ``init/``
(``dinrec train --init-from init`` finds it there); the job resumes from its own checkpoints across
interruptions, and this run's folder remembers the job, so a retrain killed while it waits takes the
same job back. The bundle the job returns is taken only if the job's own instance signed it
(spot.signing); it gets the run's lineage in its manifest (outside the checksummed files) and becomes
the run's candidate.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from dinrec.models.bundle import Bundle, load_bundle, verify_bundle
from dinrec.storage import LocalStorage, folder_written_atomically
from dinrec.training.settings import TrainSettings

TRAIN_SETTINGS = "train-settings.json"  # in the job's data folder


class SpotFailed(RuntimeError):
    def __init__(self, report: dict) -> None:
        super().__init__(f"spot job {report.get('job_id')} ended {report.get('status')}")
        self.report = report


def train_on_spot(run_dir: Path, samples_dir: Path, champion: Bundle | None, t: TrainSettings,
                  instance_types: list[str], lineage: dict, towers: bool = False) -> tuple[Bundle, dict]:
    """(the candidate bundle, the job's cost report). ``towers``: warm-start the towers too."""
    from dinrec.spot.agent import fetch_data
    from dinrec.spot.settings import SpotSettings
    from dinrec.spot.signing import SIGNATURE, ResultsRejected, check_results, job_key
    from dinrec.spot.supervisor import cost_report
    from dinrec.spot.wiring import create_job, job_supervisor, results_master

    settings, files = SpotSettings(), LocalStorage(run_dir)
    known = files.get_json("spot-job.json")
    if known is not None:
        job_id = known["job_id"]
    else:
        data = run_dir / "spot-data"
        shutil.rmtree(data, ignore_errors=True)
        shutil.copytree(samples_dir, data)
        # Every training setting travels with the data, so the job builds what a local run would.
        (data / TRAIN_SETTINGS).write_text(t.model_dump_json(indent=1))
        args = ["--settings", TRAIN_SETTINGS]
        if champion is not None:
            shutil.copytree(champion.path, data / "init")
            args += ["--init-from", "init", "--init-towers" if towers else "--no-init-towers"]
        store, spec = create_job(settings, data, instance_types, args)
        files.put_json("spot-job.json", {"job_id": spec.job_id, "job_uri": store.uri})
        job_id = spec.job_id
    store, spec, supervisor = job_supervisor(settings, job_id)
    state = supervisor.run()
    report = {"job_id": job_id, **cost_report(spec, state)}
    if state.status != "done":  # the next run starts a new job (this one is kept for the record)
        files.put_json(f"spot-job-{job_id}-{state.status}.json", files.get_json("spot-job.json"))
        files.delete("spot-job.json")
        raise SpotFailed(report)
    out = run_dir / "candidate"
    with folder_written_atomically(out) as tmp:
        fetch_data(store, "results/", tmp)
        if spec.backend != "sagemaker":  # SageMaker writes the results itself, from its own job
            try:
                check_results(tmp, store.get_json(SIGNATURE), job_key(results_master(settings), job_id))
            except ResultsRejected as exc:  # never the gate's candidate: the champion keeps serving
                files.put_json(f"spot-job-{job_id}-rejected.json", files.get_json("spot-job.json"))
                files.delete("spot-job.json")
                raise SpotFailed({**report, "status": "results_rejected", "reason": str(exc)}) from exc
        manifest = verify_bundle(tmp)
        (tmp / "manifest.json").write_text(json.dumps({**manifest, "lineage": lineage}, indent=1))
    return load_bundle(out), report
