"""Event streams: where behaviour events travel from producers (the API) to ingestion.

The interface is streams.base; the backend is chosen here by its type string and
imported only when chosen (``inprocess``: .inprocess, ``kafka``: .kafka_stream).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dinrec.storage.outage import MissingDependency
from dinrec.streams.base import Consumer, EventStream, Record

if TYPE_CHECKING:
    from dinrec.streams.settings import StreamSettings

__all__ = ["Consumer", "EventStream", "Record", "open_stream"]


def open_stream(settings: StreamSettings) -> EventStream:
    """Build the configured stream; backends are imported only when chosen."""
    if settings.stream == "inprocess":
        from dinrec.streams.inprocess import InProcessStream

        return InProcessStream(settings.topic)
    if settings.stream == "kafka":
        try:
            from dinrec.streams.kafka_stream import KafkaStream
        except ImportError as exc:  # pragma: no cover - confluent-kafka is a core dependency today
            raise MissingDependency("the kafka stream needs `pip install confluent-kafka`") from exc
        return KafkaStream(settings.kafka_bootstrap, settings.topic, instance_id=settings.consumer_instance_id,
                           security={k: v.get_secret_value() for k, v in settings.kafka_security.items()})
    raise ValueError(f"unknown stream type {settings.stream!r}")  # pragma: no cover - Literal guards it
