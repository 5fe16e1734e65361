"""A spot training job: its spec (what to run), its state (attempts so far), and the script an
instance runs at boot. Both documents live in the job store, so any supervisor can pick a job up."""

from __future__ import annotations

import datetime as dt
import secrets
import shlex
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from dinrec.spot.protocol import EXIT_INTERRUPTED

Outcome = Literal["done", "interrupted", "failed", "lost", "cancelled"]
JobStatus = Literal["pending", "running", "done", "failed", "cancelled", "budget_spent", "retries_exhausted"]
FINAL: tuple[str, ...] = ("done", "failed", "cancelled", "budget_spent", "retries_exhausted")


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def new_job_id() -> str:
    return f"{now():%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


class JobSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    job_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9-]{0,62}$")
    job_uri: str  # where state, data, checkpoints and results live
    backend: Literal["ec2", "sagemaker", "local"]
    instance_types: list[str] = Field(min_length=1, description="best first (the planner's ranking)")
    train_args: list[str] = Field(default_factory=list, description="extra `dinrec train` flags")
    ranks: str = Field("gpus", pattern=r"^(gpus|[1-9][0-9]{0,3})$", description=(
        "training processes per instance: gpus (one per GPU, as the planner assumes) or a count"))
    embeddings: Literal["replicated", "sharded"] | None = Field(None, description=(
        "DIN's tables (the plan's choice); None: the trainer's setting"))
    max_relaunches: int = Field(20, ge=0)
    budget_usd: float | None = Field(None, gt=0)
    region: str = "us-east-1"
    install: str = "true"
    wheel: str | None = Field(None, pattern=r"^[A-Za-z0-9_.+-]+\.whl$", description=(
        "the dinrec wheel the job uploaded (dist/<wheel>), installed by the instance if its SHA-256 is wheel_sha256"))
    wheel_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")
    created: dt.datetime = Field(default_factory=now)


class Attempt(BaseModel):
    model_config = ConfigDict(extra="forbid")

    n: int
    backend_id: str  # instance id, SageMaker training job name, or local pid
    instance_type: str
    market: Literal["spot", "on-demand"] = "spot"
    zone: str | None = None
    price_usd_per_h: float
    on_demand_usd_per_h: float
    launched: dt.datetime = Field(default_factory=now)
    ended: dt.datetime | None = None
    outcome: Outcome | None = None
    billable_s: float | None = None  # where the backend reports it (SageMaker); else ended − launched

    def hours(self, until: dt.datetime | None = None) -> float:
        if self.billable_s is not None:
            return self.billable_s / 3600
        end = self.ended or until or now()
        return max((end - self.launched).total_seconds(), 0.0) / 3600

    def cost(self, until: dt.datetime | None = None) -> float:
        return self.hours(until) * self.price_usd_per_h


class JobState(BaseModel):
    model_config = ConfigDict(extra="forbid")

    status: JobStatus = "pending"
    reason: str | None = None
    attempts: list[Attempt] = Field(default_factory=list)
    updated: dt.datetime = Field(default_factory=now)
    fence: int = Field(0, description="the fencing token of the supervisor that wrote it (storage.Lease)")

    @property
    def current(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts and self.attempts[-1].ended is None else None

    def spent_usd(self, until: dt.datetime | None = None) -> float:
        return sum(a.cost(until) for a in self.attempts)


def launch_args(spec: JobSpec) -> list[str]:
    """The `dinrec train` flags that say how the job runs on its instance: its ranks and its tables (sharded
    tables train the pointwise objective: training.sharded)."""
    tables = ["--embeddings", spec.embeddings] if spec.embeddings else []
    if spec.embeddings == "sharded":
        tables += ["--objective", "pointwise"]
    return ["--ranks", spec.ranks, *tables]


def _copy(src: str, dst: str) -> str:
    """A shell line copying one file from or to the job store, before dinrec is installed (the AWS CLI
    on an instance; ``cp`` for a folder store)."""
    if src.startswith("s3://") or dst.startswith("s3://"):
        return f"aws s3 cp --only-show-errors {src} {dst}"
    return f"mkdir -p \"$(dirname {dst})\" && cp {src} {dst}"


def boot_script(spec: JobSpec, attempt: int, *, endpoint_url: str | None = None, job_key: str | None = None) -> str:
    """The user-data an instance runs: install (the job's wheel, if its hash is the one recorded), fetch
    the data, train under the agent (resuming from the job's S3 checkpoints), and power off when
    finished — an interrupted instance is left for AWS to reclaim. ``job_key`` signs the results
    (spot.signing). The environment can override the IMDS address, work folder and shutdown command (a
    local run sets them; on EC2 the defaults apply)."""
    q = shlex.quote
    job = spec.job_uri.rstrip("/")
    train_cmd = 'dinrec train --data "$WORK/data" --out "$WORK/out" ' + shlex.join(
        ["--checkpoint-dir", f"{job}/checkpoints", "--resume", "auto", "--no-progress", *launch_args(spec),
         *spec.train_args])
    lines = [
        "#!/bin/bash",
        f"# dinrec spot job {spec.job_id}, attempt {attempt}",
        "set -u",
        'WORK="${DINREC_SPOT_WORKDIR:-/opt/dinrec}"',
        'mkdir -p "$WORK"',
        f"export DINREC_SPOT_REGION={q(spec.region)} AWS_DEFAULT_REGION={q(spec.region)}",
    ]
    if endpoint_url:
        lines.append(f"export DINREC_SPOT_ENDPOINT_URL={q(endpoint_url)} AWS_ENDPOINT_URL={q(endpoint_url)}")
    if job_key:
        lines.append(f"export DINREC_SPOT_JOB_KEY={q(job_key)}")
    if spec.wheel:
        wheel = f'"$WORK/{spec.wheel}"'
        lines += [
            # Before dinrec is installed the agent cannot report: the script writes the failure itself.
            "refuse() {",
            f'  printf \'{{"attempt": {attempt}, "state": "failed", "reason": "%s"}}\' "$1" > "$WORK/failed.json"',
            f'  {_copy(chr(34) + "$WORK/failed.json" + chr(34), q(f"{job}/attempts/{attempt}/status.json"))}',
            '  echo "$1" >&2; ${DINREC_SPOT_SHUTDOWN_CMD:-shutdown -h now}; exit 1',
            "}",
            f"{_copy(q(f'{job}/dist/{spec.wheel}'), wheel)} || refuse 'the job wheel could not be fetched'",
            f"echo {q(f'{spec.wheel_sha256}  ')}{wheel} | sha256sum -c --status - "
            f"|| refuse {q(f'{spec.wheel}: not the SHA-256 the job recorded ({spec.wheel_sha256})')}",
        ]
    lines += [
        spec.install,
        f"dinrec spot agent --job-uri {q(job)} --attempt {attempt} --data-dir \"$WORK/data\" "
        f"--results \"$WORK/out/bundle\" -- {train_cmd}",
        "code=$?",
        f'if [ "$code" -ne {EXIT_INTERRUPTED} ]; then ${{DINREC_SPOT_SHUTDOWN_CMD:-shutdown -h now}}; fi',
        'exit "$code"',
    ]
    return "\n".join(lines) + "\n"
