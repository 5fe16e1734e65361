"""The event-stream interface (publish; consume in a group; commit) and its factory.

Every backend carries events as the bytes of ``BehaviourEvent.to_bytes()``, the in-process one
included, so a serialisation bug shows up on a laptop, not first in production.
Delivery is at least once: a consumer that dies before ``commit`` gets the records again, which
the online stores absorb (writes are idempotent per event_id).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from feature_store.errors import MissingDependency
from feature_store.schema import BehaviourEvent

if TYPE_CHECKING:
    from feature_store.settings import FeatureStoreSettings


@dataclass(frozen=True)
class Record:
    value: bytes
    partition: int
    offset: int


class Consumer(ABC):
    @abstractmethod
    def poll(self, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        """Up to ``max_records`` records after the last polled position; [] after ``timeout_s``."""

    @abstractmethod
    def commit(self) -> None:
        """Mark everything polled so far as done for this consumer group."""

    def close(self) -> None:  # noqa: B027 - optional hook
        pass


class EventStream(ABC):
    @abstractmethod
    def publish(self, events: Sequence[BehaviourEvent]) -> None:
        """Send events (keyed by user, so one user's events stay in order)."""

    @abstractmethod
    def consumer(self, group: str) -> Consumer: ...

    def close(self) -> None:  # noqa: B027 - optional hook
        pass


def open_stream(settings: FeatureStoreSettings) -> EventStream:
    if settings.stream == "inprocess":
        from feature_store.streams.inprocess import InProcessStream

        return InProcessStream()
    if settings.stream == "kafka":
        try:
            from feature_store.streams.kafka_stream import KafkaStream
        except ImportError as exc:  # pragma: no cover - kafka-python is a core dependency today
            raise MissingDependency("the kafka stream needs `pip install kafka-python`") from exc
        return KafkaStream(settings.kafka_bootstrap, settings.topic)
    raise ValueError(f"unknown stream type {settings.stream!r}")  # pragma: no cover
