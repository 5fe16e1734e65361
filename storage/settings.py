"""The facts every process of one deployment must agree on — where the model registry is, which file
holds the A/B experiments, which topic carries the events — each read from one variable
(``DINREC_REGISTRY``, ``DINREC_EXPERIMENTS_FILE``, ``DINREC_TOPIC``, ``DINREC_REGISTRY_CACHE``)
whatever the reading component's own prefix: the service, the ingest and archive processes and the
retrain job cannot be pointed at two different registries or topics by a typo in one of them."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class SharedSettings(BaseSettings):
    """Shared by the service, the feature store's processes and the retrain job (each of their settings
    classes has these fields, read from these variables)."""

    # populate_by_name: `ServingSettings(registry=…)` as well as the variable's name.
    model_config = SettingsConfigDict(extra="forbid", validate_default=True, populate_by_name=True)

    registry: str | None = Field(None, validation_alias="DINREC_REGISTRY", description=(
        "the model registry, a folder or s3://bucket/prefix: the service serves an alias from it, retrain "
        "publishes to it (required there)"))
    registry_cache: Path | None = Field(None, validation_alias="DINREC_REGISTRY_CACHE", description=(
        "where versions from an S3 registry are downloaded (default ~/.cache/dinrec/registry/…)"))
    experiments_file: str | None = Field(None, validation_alias="DINREC_EXPERIMENTS_FILE", description=(
        "the A/B experiments document (JSON, experiments.spec.ExperimentFile), a file or "
        "s3://bucket/prefix/experiments.json: the service runs them, the admin API and retrain's "
        "rollout=challenger change them (compare-and-swap: a change made against an older version is refused); "
        "none by default"))
    topic: str = Field("dinrec.events", pattern=r"^[A-Za-z0-9._-]{1,245}$", validation_alias="DINREC_TOPIC",
                       description="the events topic (its dead letters go to <topic>.dlq); the archive keeps it")

    @field_validator("experiments_file", mode="before")
    @classmethod
    def _location(cls, value: object) -> object:
        return str(value) if isinstance(value, Path) else value  # a Path from Python callers, a string from the env
