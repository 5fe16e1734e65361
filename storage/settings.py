"""The facts every process of one deployment must agree on — where the model registry is, which file
holds the A/B experiments, which topic carries the events — each read from one variable
(``DINREC_REGISTRY``, ``DINREC_EXPERIMENTS_FILE``, ``DINREC_TOPIC``, ``DINREC_REGISTRY_CACHE``)
whatever the reading component's own prefix: the service, the ingest and archive processes and the
retrain job cannot be pointed at two different registries or topics by a typo in one of them."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
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
    experiments_file: Path | None = Field(None, validation_alias="DINREC_EXPERIMENTS_FILE", description=(
        "the A/B experiments (JSON, experiments.spec.ExperimentFile): the service runs them, retrain's "
        "rollout=challenger adds to them; none by default"))
    topic: str = Field("dinrec.events", pattern=r"^[A-Za-z0-9._-]{1,245}$", validation_alias="DINREC_TOPIC",
                       description="the events topic (its dead letters go to <topic>.dlq); the archive keeps it")
