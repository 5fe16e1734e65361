"""Retraining settings (env prefix ``DINREC_RETRAIN_``; CLI flags override), validated at start-up.

What the model trains with (epochs, seq_len, negatives, …) stays in training.settings
(``DINREC_TRAIN_``): a retrained model is trained the way ``dinrec train`` trains one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from dinrec.storage.settings import SharedSettings


class RetrainSettings(SharedSettings):
    model_config = SettingsConfigDict(env_prefix="DINREC_RETRAIN_", extra="forbid", validate_default=True,
                                      populate_by_name=True)

    archive_dir: str = Field("runs/archive", description=(
        "the event archive (`dinrec ingest archive --out`): a folder or s3://bucket/prefix"))
    work_dir: Path = Field(Path("runs/retrain"), description=(
        "the job's own state: one folder per data window (samples, checkpoints, candidate, report)"))
    lease_s: float = Field(60.0, ge=1, le=3600, description=(
        "one retrain per registry at a time: a lease in the registry (leases/retrain.json) renewed every third "
        "of this; a run that dies frees it this long after its last renewal"))
    history_days: float = Field(30.0, gt=0, le=3650, description="the data window: this many days up to its end")
    align_s: int = Field(3600, ge=1, le=7 * 86_400, description=(
        "the window ends at the latest multiple of this before now, so runs within one period share a window "
        "(and a rerun resumes it)"))
    late_s: float = Field(6 * 3600, ge=0, le=30 * 86_400, description=(
        "events the stream carried up to this long after they happened are read into their window (the archive "
        "is read by produce time, from the window's start to its end plus this)"))
    min_new_events: int = Field(100, ge=1, description=(
        "behaviours after the champion's window needed to retrain; fewer: nothing to do (exit 0)"))
    min_holdout_users: int = Field(30, ge=1, description=(
        "users with a new behaviour needed to compare candidate and champion; fewer: nothing to do (exit 0)"))
    holdout: Literal["organic", "all"] = Field("organic", description=(
        "organic: the holdout leaves out clicks on served recommendations (the serving model chose what could "
        "be clicked: they favour it); all: every behaviour"))
    warm_start: bool = Field(True, description="start DIN from the champion's weights (new items/categories fresh)")
    warm_start_towers: bool = Field(False, description=(
        "start the recall towers from the champion's too (with warm_start). Off by default: warm-started towers "
        "found fewer held-out long-tail behaviours than towers trained from scratch on ml-100k and amazon-hin "
        "(dinrec bench retrain)"))
    rollout: Literal["champion", "challenger"] = Field("champion", description=(
        "champion: a model that passes the gate becomes champion; challenger: it becomes challenger and an A/B "
        "experiment against the champion starts (promote: champion), which the guardrail can stop and a win promotes"))
    ramp: list[Annotated[float, Field(gt=0, le=1)]] = Field([0.05, 0.25, 0.5], min_length=1, description=(
        "rollout=challenger: the experiment's coverage steps"))
    ramp_hold_s: float = Field(3600.0, ge=0, description="rollout=challenger: least time at each ramp step")
    spot_instance_types: list[str] = Field(["g5.xlarge", "g4dn.xlarge"], min_length=1, description=(
        "--spot: the instance types the job may use, best first (`dinrec plan` ranks them)"))
    # The gate: the candidate is refused when worse than the champion by more than these.
    gauc_tolerance: float = Field(0.005, ge=0, le=1, description="GAUC, absolute")
    auc_tolerance: float = Field(0.01, ge=0, le=1, description="AUC, absolute")
    logloss_tolerance: float = Field(0.02, ge=0, le=10, description="logloss, relative (0.02: 2 % higher)")
    calibration_tolerance: float = Field(0.1, ge=0, le=10, description=(
        "calibration error |log(mean predicted CTR / observed CTR)|, absolute"))
    recall_tolerance: float = Field(0.02, ge=0, le=1, description="recall HR@200, absolute")
    tail_tolerance: float = Field(0.02, ge=0, le=1, description="HR@recall_k on long-tail behaviours, absolute")
    served_tolerance: float = Field(0.02, ge=0, le=1, description="served HR@10 vs the champion's, absolute")
    baseline_tolerance: float = Field(0.02, ge=0, le=1, description=(
        "HR@10 of the served list vs popularity's and item-CF's on the same holdout, absolute: a candidate "
        "(the first model too) further below either is refused"))
    min_gauc: float = Field(0.55, ge=0, le=1, description="a first model (no champion) must reach this holdout GAUC")
    recall_k: int = Field(200, ge=1, le=10_000, description="HR@k of recall")

    @model_validator(mode="after")
    def _challenger_needs_the_experiments_file(self) -> RetrainSettings:
        if self.rollout == "challenger" and self.experiments_file is None:
            raise ValueError("rollout=challenger needs DINREC_EXPERIMENTS_FILE (the services' experiments file)")
        return self
