"""What a spot job brings back, and what it installs, are checked: nothing another job's instance wrote
and no package swapped on an index reaches the retrain gate.

* **Results are signed with the job's own key.** The supervisors hold a master key
  (``DINREC_SPOT_RESULTS_KEY``, or a key file made on first use at ``~/.config/dinrec/spot-results.key``;
  supervisors on several machines share one). Each job's key is derived from it (HMAC of the job id),
  and only that job's instances get it (in their boot script). The agent signs the digest of every
  result file (``results.sig.json`` beside ``results/``), and whoever takes the results checks the files
  it downloaded against it (:func:`check_results`): an instance of another job — which its own role
  (spot.job_role) already keeps out of this job's prefix on EC2, and a shared role (SageMaker's) does
  not — cannot sign for this one, and a file changed after signing fails its digest. The agent hands the
  key to its trainer, which signs its checkpoints with it and resumes only from signed ones
  (training.checkpoint).
* **The instance installs the wheel the job uploaded, by its hash** (``DINREC_SPOT_WHEEL``): the boot
  script refuses a wheel whose SHA-256 is not the one the job recorded (spot.job.boot_script).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path

from dinrec.storage import file_sha256

SIGNATURE = "results.sig.json"  # in the job store, beside results/
KEY_FILE = Path("~/.config/dinrec/spot-results.key")


class ResultsRejected(RuntimeError):
    """The job's results are not what its own instance signed."""


def master_key(configured: str | None, key_file: Path = KEY_FILE) -> bytes:
    """``configured`` (DINREC_SPOT_RESULTS_KEY), else this machine's key file, made on first use (0600)."""
    if configured:
        return configured.encode()
    path = key_file.expanduser()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process made it meanwhile: read theirs
            pass
        else:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
    key = path.read_text().strip()
    if len(key) < 32:
        raise ValueError(f"{path}: the spot results key is empty or short (remove it to have a new one made)")
    return key.encode()


def job_key(master: bytes, job_id: str) -> str:
    """The key of one job: its instances sign with it; it says nothing about any other job's."""
    return hmac.new(master, f"dinrec spot results {job_id}".encode(), hashlib.sha256).hexdigest()


def digest(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (its path relative to the folder, ``/``-separated) → its SHA-256."""
    return {p.relative_to(folder).as_posix(): file_sha256(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def _signature(files: dict[str, str], key: str) -> str:
    return hmac.new(key.encode(), json.dumps(files, sort_keys=True).encode(), hashlib.sha256).hexdigest()


def signed(folder: Path, key: str) -> dict:
    """The signature document of ``folder``'s files (what the agent puts at :data:`SIGNATURE`)."""
    files = digest(folder)
    return {"files": files, "signature": _signature(files, key)}


def check_results(folder: Path, document: dict | None, key: str) -> None:
    """Raise ResultsRejected unless ``folder`` holds exactly the files ``document`` lists, as signed with
    ``key``."""
    if not isinstance(document, dict) or not isinstance(document.get("files"), dict):
        raise ResultsRejected(f"the results carry no signature ({SIGNATURE}): not written by the job's agent")
    if not hmac.compare_digest(str(document.get("signature", "")), _signature(document["files"], key)):
        raise ResultsRejected("the results' signature is not the job's: written by something that does not hold "
                              "its key")
    have = digest(folder)
    if have != document["files"]:
        changed = sorted(set(have) ^ set(document["files"]) | {f for f in have if have[f] != document["files"].get(f)})
        raise ResultsRejected(f"the results differ from what the job signed: {', '.join(changed[:5])}")
