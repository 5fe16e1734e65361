"""Spot job settings (env prefix ``DINREC_SPOT_``; CLI flags override), validated at start-up."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class SpotSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DINREC_SPOT_", extra="forbid", validate_default=True)

    region: str = Field("us-east-1", description="AWS region of the instances, prices and state bucket")
    endpoint_url: str | None = Field(None, description="one endpoint for every AWS service (a local moto server)")
    live_prices: bool = Field(True, description="ask EC2 for current spot prices; fall back to the catalog")
    state_uri: str = Field("~/.cache/dinrec/spot/state",
                           description="s3://bucket/prefix (or a local folder) where jobs keep state and checkpoints")
    backend: Literal["local", "ec2", "sagemaker"] = Field("local", description="local: attempts run on this machine")
    image_id: str | None = Field(None, description="AMI with the NVIDIA driver (EC2 backend)")
    subnet_ids: list[str] = Field(default_factory=list, description="one per availability zone to spread over")
    security_group_ids: list[str] = Field(default_factory=list, description=(
        "security groups of the instances (EC2 backend; JSON list)"))
    instance_boundary_arn: str | None = Field(None, description=(
        "EC2 backend: the permissions boundary (deploy/aws/instance-boundary.json as a managed policy) under which "
        "each job gets its own instance role, one that may write only that job's prefix; deleted when the job ends"))
    key_name: str | None = Field(None, description="EC2 key pair for SSH to the instances (none: no SSH)")
    install: str = Field("pip install 'dinrec[gpu]'", description=(
        "shell line that installs dinrec on the instance, where no DINREC_SPOT_WHEEL is given (set it explicitly: "
        "an instance should not install whatever an index serves under a name)"))
    wheel: Path | None = Field(None, description=(
        "a dinrec wheel (`pip wheel --no-deps -w dist .`): each job uploads it, and its instances install it with "
        "its [gpu] extra only if its SHA-256 is the one the job recorded"))
    results_key: SecretStr | None = Field(None, min_length=32, description=(
        "the supervisors' master key: each job's results are signed by its instances with a key derived from it "
        "and checked before the retrain gate takes them (default: a key file made on first use at "
        "~/.config/dinrec/spot-results.key; supervisors on several machines set one key)"))
    sagemaker_role_arn: str | None = Field(None, description=(
        "IAM role SageMaker training jobs run as (SageMaker backend)"))
    sagemaker_image_uri: str | None = Field(None, description="training image with dinrec installed")
    max_relaunches: int = Field(20, ge=0, description="give up after this many interrupted attempts")
    budget_usd: float | None = Field(None, gt=0, description="stop relaunching once this much is spent")
    poll_s: float = Field(15.0, gt=0, description="supervisor poll interval")
    lease_s: float = Field(60.0, ge=1, le=3600, description=(
        "one supervisor per job: the job's lease (lease.json in its store), renewed every third of this; a "
        "supervisor that dies frees the job this long after its last renewal"))
    imds_url: str = Field("http://169.254.169.254", description="instance metadata (IMDSv2); 'none' = do not watch")
    imds_poll_s: float = Field(5.0, gt=0, description="how often the agent checks for an interruption notice")
    workdir: str = Field("~/.cache/dinrec/spot", description="local backend: where attempts run")
