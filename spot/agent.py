"""`dinrec spot agent`: runs on the spot instance around `dinrec train`.

It starts the trainer as a child process and watches IMDSv2: a rebalance recommendation sends the
trainer SIGUSR1 (one extra checkpoint, keep going); an interruption notice sends SIGTERM (finish
the step, checkpoint to S3, exit 75) well inside the 2-minute notice. It reports each attempt's
outcome to the job store (``attempts/<n>/status.json``) — that is how the supervisor tells an
interruption from completion or failure — and uploads the results when training is done, signed with
the job's key (spot.signing).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
from pathlib import Path

from dinrec.spot.imds import Imds, ImdsError, InterruptionNotice, InterruptionWatcher
from dinrec.spot.job import now
from dinrec.spot.jobstore import JobStore
from dinrec.spot.protocol import EXIT_INTERRUPTED
from dinrec.spot.signing import SIGNATURE, signed

log = logging.getLogger(__name__)


def _now() -> str:
    return now().isoformat(timespec="seconds")


def outcome(exit_code: int) -> str:
    if exit_code == 0:
        return "done"
    return "interrupted" if exit_code == EXIT_INTERRUPTED else "failed"


def fetch_data(store: JobStore, prefix: str, into: Path) -> int:
    """Copy the job's dataset (uploaded under ``prefix``) to a local folder; returns the file count."""
    keys = store.keys(prefix)
    for key in keys:
        data = store.get_bytes(key)
        if data is None:
            continue
        relative = key[len(prefix):].lstrip("/")
        path = (into / relative).resolve()
        if not relative or ".." in Path(relative).parts or not path.is_relative_to(into.resolve()):
            log.warning("job data key %r is not a path inside the dataset: skipped", key)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return len(keys)


def run_agent(store: JobStore, attempt: int, command: list[str], *, imds: Imds | None,
              results: Path | None = None, poll_s: float = 5.0) -> int:
    """Run ``command`` under the watcher; returns its exit code after reporting the outcome."""
    status_key = f"attempts/{attempt}/status.json"
    instance_id = None
    if imds is not None:
        try:
            instance_id = imds.instance_id()
        except ImdsError as exc:
            log.warning("%s", exc)
    status = {"attempt": attempt, "state": "running", "instance_id": instance_id, "started": _now()}
    store.put_json(status_key, status)
    # Its own process group: a signal reaches every training rank at once (`dinrec train --ranks N`
    # launches one process per rank; the launcher waits for their checkpoints).
    # The job's key signs the trainer's checkpoints too: a resume takes only this job's (training.checkpoint).
    key = os.environ.get("DINREC_SPOT_JOB_KEY")
    child = subprocess.Popen(command, process_group=0,
                             env={**os.environ, "DINREC_CHECKPOINT_KEY": key} if key else None)

    def forward(sig: int) -> None:
        if child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, sig)

    def on_interruption(notice: InterruptionNotice) -> None:
        status["notice"] = {"action": notice.action, "time": notice.time, "seen": _now()}
        forward(signal.SIGTERM)

    # the OS (shutdown) or a person may stop the agent itself: pass it on so the trainer checkpoints
    previous = {sig: signal.signal(sig, lambda s, _f: forward(s)) for sig in (signal.SIGTERM, signal.SIGINT)}
    watcher = None
    if imds is not None:
        watcher = InterruptionWatcher(imds, on_interruption=on_interruption,
                                      on_rebalance=lambda: forward(signal.SIGUSR1), poll_s=poll_s).start()
    try:
        code = child.wait()
    finally:
        if watcher is not None:
            watcher.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    status.update(state=outcome(code), exit_code=code, ended=_now())
    if code == 0 and results is not None and results.exists():
        store.upload_dir(results, "results")
        if key:  # the job's own key: what the retrain gate checks the results against (spot.signing)
            store.put_json(SIGNATURE, signed(results, key))
        else:
            log.error("no DINREC_SPOT_JOB_KEY: the results are not signed, and the retrain gate will refuse them")
        status["results"] = store.child_uri("results")
    store.put_json(status_key, status)
    log.warning("attempt %d: %s (exit %d)", attempt, status["state"], code)
    return code
