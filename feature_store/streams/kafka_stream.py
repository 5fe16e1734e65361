"""Apache Kafka stream (kafka-python). Client errors become StreamUnavailable here, once."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient
from kafka.consumer.subscription_state import ConsumerRebalanceListener
from kafka.errors import IllegalStateError, KafkaError, TopicAlreadyExistsError
from kafka.structs import OffsetAndMetadata

from feature_store.errors import StreamUnavailable
from feature_store.streams.base import Consumer, EventStream, OutgoingRecord, PartitionsHook, Record

log = logging.getLogger(__name__)


class KafkaStream(EventStream):
    def __init__(self, bootstrap: str, topic: str, *, request_timeout_ms: int = 10_000,
                 instance_id: str | None = None) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.instance_id = instance_id  # static group membership of this stream's consumers
        self._timeout_ms = request_timeout_ms
        self._producer: KafkaProducer | None = None

    def _get_producer(self) -> KafkaProducer:
        if self._producer is None:
            try:
                # acks=all + kafka-python's idempotent producer (its default): retries never duplicate.
                self._producer = KafkaProducer(
                    bootstrap_servers=self.bootstrap, acks="all", linger_ms=5,
                    request_timeout_ms=self._timeout_ms, max_block_ms=self._timeout_ms,
                    bootstrap_timeout_ms=self._timeout_ms,
                )
            except KafkaError as exc:
                raise StreamUnavailable(f"kafka not reachable at {self.bootstrap}: {exc}") from exc
        return self._producer

    def publish_raw(self, records: Sequence[OutgoingRecord]) -> None:
        producer = self._get_producer()
        try:
            futures = [producer.send(self.topic, key=r.key, value=r.value, headers=list(r.headers) or None)
                       for r in records]
            producer.flush(timeout=self._timeout_ms / 1000)
            for f in futures:
                f.get(timeout=self._timeout_ms / 1000)  # surface per-record delivery errors
        except KafkaError as exc:
            raise StreamUnavailable(f"kafka publish to {self.topic!r} failed: {exc}") from exc

    def consumer(self, group: str, *, on_assigned: PartitionsHook | None = None,
                 on_revoked: PartitionsHook | None = None) -> Consumer:
        return _KafkaConsumer(self, group, on_assigned, on_revoked)

    def sibling(self, topic: str) -> EventStream:
        return KafkaStream(self.bootstrap, topic, request_timeout_ms=self._timeout_ms)

    def _admin(self) -> KafkaAdminClient:
        try:
            return KafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=self._timeout_ms,
                                    bootstrap_timeout_ms=self._timeout_ms)
        except KafkaError as exc:
            raise StreamUnavailable(f"kafka not reachable at {self.bootstrap}: {exc}") from exc

    def ensure_topic(self, partitions: int, replication: int = 1) -> int:
        admin = self._admin()
        try:
            try:
                admin.create_topics({self.topic: {"num_partitions": partitions, "replication_factor": replication}},
                                    wait_for_metadata=True)
                log.info("created topic %s with %d partitions", self.topic, partitions)
            except TopicAlreadyExistsError:
                pass
            described = admin.describe_topics([self.topic])
        except KafkaError as exc:
            raise StreamUnavailable(f"kafka topic {self.topic!r} could not be created: {exc}") from exc
        finally:
            admin.close()
        have = len(described[0]["partitions"])
        if have < partitions:
            # Not raised automatically: more partitions move users to other partitions (key hashing).
            log.warning("topic %s has %d partitions (%d wanted); add them with kafka-topics --alter",
                        self.topic, have, partitions)
        return have

    def end_offsets(self) -> dict[int, int]:
        try:
            c = KafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False,
                              request_timeout_ms=max(self._timeout_ms, 30_001),
                              bootstrap_timeout_ms=self._timeout_ms)
        except KafkaError as exc:
            raise StreamUnavailable(f"kafka not reachable at {self.bootstrap}: {exc}") from exc
        try:
            parts = c.partitions_for_topic(self.topic) or set()
            ends = c.end_offsets([TopicPartition(self.topic, p) for p in parts]) if parts else {}
        except KafkaError as exc:
            raise StreamUnavailable(f"kafka offsets of {self.topic!r} unavailable: {exc}") from exc
        finally:
            c.close(autocommit=False)
        return {tp.partition: off for tp, off in ends.items()}

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close(timeout=5)
            self._producer = None


class _Listener(ConsumerRebalanceListener):
    # Runs on kafka-python's I/O thread: only tell the hooks, which only record the change.
    def __init__(self, on_assigned: PartitionsHook | None, on_revoked: PartitionsHook | None) -> None:
        self._assigned, self._revoked = on_assigned, on_revoked

    def on_partitions_revoked(self, revoked) -> None:
        if self._revoked:
            self._revoked({tp.partition for tp in revoked})

    def on_partitions_assigned(self, assigned) -> None:
        if self._assigned:
            self._assigned({tp.partition for tp in assigned})


class _KafkaConsumer(Consumer):
    def __init__(self, stream: KafkaStream, group: str, on_assigned: PartitionsHook | None,
                 on_revoked: PartitionsHook | None) -> None:
        self._topic = stream.topic
        try:
            self._c = KafkaConsumer(
                bootstrap_servers=stream.bootstrap, group_id=group, group_instance_id=stream.instance_id,
                enable_auto_commit=False, auto_offset_reset="earliest",
                request_timeout_ms=max(stream._timeout_ms, 30_001),  # must exceed session timeout
                session_timeout_ms=10_000, heartbeat_interval_ms=3_000,
                bootstrap_timeout_ms=stream._timeout_ms,
            )
            self._c.subscribe([stream.topic], listener=_Listener(on_assigned, on_revoked))
        except KafkaError as exc:
            raise StreamUnavailable(f"kafka not reachable at {stream.bootstrap}: {exc}") from exc

    def poll(self, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        try:
            batches = self._c.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        except KafkaError as exc:
            raise StreamUnavailable(f"kafka poll failed: {exc}") from exc
        out = [Record(r.value, tp.partition, r.offset, r.key, tuple(r.headers or ()), r.timestamp)
               for tp, recs in batches.items() for r in recs]
        return sorted(out, key=lambda r: (r.partition, r.offset))

    def seek(self, partition: int, offset: int) -> None:
        try:
            self._c.seek(TopicPartition(self._topic, partition), max(0, offset))
        except ValueError:  # no longer ours after a rebalance: its new owner resumes from the store
            log.info("not seeking partition %d: no longer assigned", partition)

    def commit(self, offsets: Mapping[int, int]) -> None:
        if not offsets:
            return
        try:
            self._c.commit({TopicPartition(self._topic, p): OffsetAndMetadata(o, "", -1) for p, o in offsets.items()})
        except KafkaError as exc:
            raise StreamUnavailable(f"kafka commit failed: {exc}") from exc

    def highwaters(self) -> dict[int, int]:
        out = {}
        for tp in list(self._c.assignment()):
            try:
                end = self._c.highwater(tp)
            except IllegalStateError:  # revoked meanwhile
                continue
            if end is not None:
                out[tp.partition] = end
        return out

    def close(self) -> None:
        self._c.close(autocommit=False)
