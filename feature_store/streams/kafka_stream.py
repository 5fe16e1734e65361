"""Apache Kafka stream (kafka-python). Client errors become StreamUnavailable here, once."""

from __future__ import annotations

from collections.abc import Sequence

from kafka import KafkaConsumer, KafkaProducer
from kafka.errors import KafkaError

from feature_store.errors import StreamUnavailable
from feature_store.schema import BehaviourEvent
from feature_store.streams.base import Consumer, EventStream, Record


class KafkaStream(EventStream):
    def __init__(self, bootstrap: str, topic: str, *, request_timeout_ms: int = 10_000) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self._timeout_ms = request_timeout_ms
        self._producer: KafkaProducer | None = None

    def _get_producer(self) -> KafkaProducer:
        if self._producer is None:
            try:
                self._producer = KafkaProducer(
                    bootstrap_servers=self.bootstrap, acks="all", linger_ms=5,
                    request_timeout_ms=self._timeout_ms, max_block_ms=self._timeout_ms,
                    bootstrap_timeout_ms=self._timeout_ms,
                )
            except KafkaError as exc:
                raise StreamUnavailable(f"kafka not reachable at {self.bootstrap}: {exc}") from exc
        return self._producer

    def publish(self, events: Sequence[BehaviourEvent]) -> None:
        self.publish_raw([(e.user_id.encode(), e.to_bytes()) for e in events])

    def publish_raw(self, keyed: Sequence[tuple[bytes | None, bytes]]) -> None:
        producer = self._get_producer()
        try:
            futures = [producer.send(self.topic, key=k, value=v) for k, v in keyed]
            producer.flush(timeout=self._timeout_ms / 1000)
            for f in futures:
                f.get(timeout=self._timeout_ms / 1000)  # surface per-record delivery errors
        except KafkaError as exc:
            raise StreamUnavailable(f"kafka publish to {self.topic!r} failed: {exc}") from exc

    def consumer(self, group: str) -> Consumer:
        return _KafkaConsumer(self, group)

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close(timeout=5)
            self._producer = None


class _KafkaConsumer(Consumer):
    def __init__(self, stream: KafkaStream, group: str) -> None:
        try:
            self._c = KafkaConsumer(
                stream.topic, bootstrap_servers=stream.bootstrap, group_id=group,
                enable_auto_commit=False, auto_offset_reset="earliest",
                request_timeout_ms=max(stream._timeout_ms, 30_001),  # must exceed session timeout
                session_timeout_ms=10_000, heartbeat_interval_ms=3_000,
                bootstrap_timeout_ms=stream._timeout_ms,
            )
        except KafkaError as exc:
            raise StreamUnavailable(f"kafka not reachable at {stream.bootstrap}: {exc}") from exc

    def poll(self, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        try:
            batches = self._c.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        except KafkaError as exc:
            raise StreamUnavailable(f"kafka poll failed: {exc}") from exc
        out = [Record(r.value, tp.partition, r.offset) for tp, recs in batches.items() for r in recs]
        return sorted(out, key=lambda r: (r.partition, r.offset))

    def commit(self) -> None:
        try:
            self._c.commit()
        except KafkaError as exc:
            raise StreamUnavailable(f"kafka commit failed: {exc}") from exc

    def close(self) -> None:
        self._c.close(autocommit=False)
