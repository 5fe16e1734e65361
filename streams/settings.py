"""The event stream's settings (env prefix ``DINREC_``), created at start-up, never at import."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import SettingsConfigDict

from dinrec.storage.settings import SharedSettings


class StreamSettings(SharedSettings):
    # extra="forbid": a mistyped keyword raises; other packages' DINREC_* variables are not read as
    # fields (dinrec.cli.config reports the ones no settings class knows).
    model_config = SettingsConfigDict(env_prefix="DINREC_", extra="forbid", validate_default=True,
                                      populate_by_name=True)

    stream: Literal["inprocess", "kafka"] = Field("inprocess", description=(
        "the event stream: inprocess (embedded) or kafka"))
    kafka_bootstrap: str = Field("127.0.0.1:9092", min_length=3, description=(
        "Kafka bootstrap servers (host:port[,host:port…])"))
    kafka_security: dict[str, SecretStr] = Field(default_factory=dict, description=(
        'Kafka client settings for TLS and SASL, passed to every producer, consumer and admin client (JSON: '
        '{"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": …}); only '
        "security.*, sasl.*, ssl.* keys; values are kept secret in logs"))
    topic_partitions: int = Field(8, ge=1, le=10_000,
                                  description="partitions of the topic when dinrec creates it: the most consumers "
                                              "that can share ingestion")
    topic_replication: int = Field(1, ge=1, le=16, description="replication factor of topics dinrec creates")
    consumer_group: str = Field("dinrec-ingest", min_length=1, description=(
        "the Kafka consumer group ingesters share (one partition is read by one of them)"))
    consumer_instance_id: str | None = Field(
        None, min_length=1, description="Kafka static membership (e.g. the pod name): a restarted consumer takes its "
                                        "partitions back at once instead of waiting out the session timeout")
    outbox_dir: Path | None = Field(
        None, description="journal of events the API accepted and the stream has not acknowledged yet; default "
                          "$XDG_STATE_HOME/dinrec/outbox/<topic> for Kafka, a fresh temp dir for the in-process stream")
    outbox_max_bytes: int = Field(256 << 20, ge=1 << 16, description="beyond this, POST /events answers 503")
    outbox_fsync: bool = Field(False, description="fsync each accepted batch (survives a machine crash, slower)")

    @field_validator("kafka_security")
    @classmethod
    def _only_security_keys(cls, conf: dict[str, SecretStr]) -> dict[str, SecretStr]:
        other = sorted(k for k in conf if not k.startswith(("security.", "sasl.", "ssl.")))
        if other:
            raise ValueError(f"only security.*, sasl.* and ssl.* keys (dinrec sets the rest): {', '.join(other)}")
        return conf
