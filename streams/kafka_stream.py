"""Apache Kafka stream on confluent-kafka (librdkafka). Client errors become StreamUnavailable here,
once.

librdkafka rather than a pure-Python client: decoding a fetched record costs ~4 µs instead of ~13,
which is most of a consumer's budget at 50,000 events/s on two cores. Rebalance callbacks run
inside ``poll``, on the caller's thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

from confluent_kafka import Consumer as _RdConsumer
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from dinrec.streams.base import Consumer, EventStream, Headers, OutgoingRecord, PartitionsHook, Record
from dinrec.streams.errors import StreamUnavailable

log = logging.getLogger(__name__)
_rdkafka_log = logging.getLogger("dinrec.streams.librdkafka")


class KafkaStream(EventStream):
    def __init__(self, bootstrap: str, topic: str, *, request_timeout_ms: int = 10_000,
                 instance_id: str | None = None, security: Mapping[str, str] | None = None) -> None:
        """``security``: TLS/SASL client settings (``security.protocol``, ``sasl.*``, ``ssl.*``), given to
        every client this stream makes."""
        self.bootstrap = bootstrap
        self._security = dict(security or {})
        self.topic = topic
        self.instance_id = instance_id  # static group membership of this stream's consumers
        self._timeout_s = request_timeout_ms / 1000
        self._producer: Producer | None = None

    def _conf(self, **extra) -> dict:
        return {**self._security, "bootstrap.servers": self.bootstrap, "socket.timeout.ms": int(self._timeout_s * 1000),
                "logger": _rdkafka_log, **extra}

    def _get_producer(self) -> Producer:
        if self._producer is None:
            # acks=all + the idempotent producer: a retried send is never written twice. The partitioner
            # named, not left to the default: the store tags users' keys by it (events.partitioning).
            self._producer = Producer(self._conf(**{
                "enable.idempotence": True, "acks": "all", "linger.ms": 5, "partitioner": "consistent_random",
                "delivery.timeout.ms": int(self._timeout_s * 1000)}))
        return self._producer

    def publish_raw(self, records: Sequence[OutgoingRecord]) -> None:
        producer = self._get_producer()
        failed: list[str] = []

        def delivered(err: KafkaError | None, _msg) -> None:
            if err is not None:
                failed.append(err.str())

        deadline = time.monotonic() + self._timeout_s
        try:
            for r in records:
                while True:
                    try:
                        producer.produce(self.topic, r.value, r.key, headers=list(r.headers) or None,
                                         timestamp=r.timestamp_ms or 0, on_delivery=delivered)
                        break
                    except BufferError:  # the local queue is full: let it drain
                        if producer.poll(0.05) == 0 and time.monotonic() > deadline:
                            raise
            left = producer.flush(max(0.0, deadline - time.monotonic()))
        except (KafkaException, BufferError) as exc:
            raise StreamUnavailable(f"kafka publish to {self.topic!r} at {self.bootstrap} failed: {exc}") from exc
        if left or failed:
            producer.purge()  # what is still queued is reported as not sent, not delivered later
            producer.flush(0)
            self._producer = None  # a fresh one next time (an idempotent producer may be left fenced)
            why = failed[0] if failed else f"{left} records not acknowledged within {self._timeout_s:g}s"
            raise StreamUnavailable(f"kafka publish to {self.topic!r} at {self.bootstrap} failed: {why}")

    def consumer(self, group: str, *, on_assigned: PartitionsHook | None = None,
                 on_revoked: PartitionsHook | None = None) -> Consumer:
        return _KafkaConsumer(self, group, on_assigned, on_revoked)

    def sibling(self, topic: str) -> EventStream:
        return KafkaStream(self.bootstrap, topic, request_timeout_ms=int(self._timeout_s * 1000),
                           security=self._security)

    def _partitions(self, client) -> list[int]:
        meta = client.list_topics(self.topic, timeout=self._timeout_s)
        topic = meta.topics.get(self.topic)
        if topic is None or topic.error is not None or not topic.partitions:
            return []
        return sorted(topic.partitions)

    def ensure_topic(self, partitions: int, replication: int = 1) -> int:
        admin = AdminClient(self._conf())
        try:
            # With replicas, a write is acknowledged (acks=all) only once two of them have it.
            config = {"min.insync.replicas": str(min(2, replication))} if replication > 1 else {}
            future = admin.create_topics([NewTopic(self.topic, num_partitions=partitions,
                                                   replication_factor=replication, config=config)])[self.topic]
            try:
                future.result(timeout=self._timeout_s)
                log.info("created topic %s with %d partitions", self.topic, partitions)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
            deadline = time.monotonic() + self._timeout_s
            while not (have := self._partitions(admin)) and time.monotonic() < deadline:
                time.sleep(0.1)  # metadata catches up with the creation
        except (KafkaException, TimeoutError) as exc:  # the admin future times out when no broker answers
            raise StreamUnavailable(f"kafka topic {self.topic!r} could not be created at {self.bootstrap}: "
                                    f"{str(exc) or f'no answer in {self._timeout_s} s'}") from exc
        if len(have) < partitions:
            # Not raised automatically: more partitions move users to other partitions (key hashing).
            log.warning("topic %s has %d partitions (%d wanted); add them with kafka-topics --alter",
                        self.topic, len(have), partitions)
        return len(have)

    def end_offsets(self) -> dict[int, int]:
        c = _RdConsumer(self._conf(**{"group.id": "dinrec-offsets-probe", "enable.auto.commit": False}))
        try:
            return {p: c.get_watermark_offsets(TopicPartition(self.topic, p), timeout=self._timeout_s)[1]
                    for p in self._partitions(c)}
        except KafkaException as exc:
            raise StreamUnavailable(f"kafka offsets of {self.topic!r} unavailable at {self.bootstrap}: "
                                    f"{exc}") from exc
        finally:
            c.close()

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(5)
            self._producer = None


class _KafkaConsumer(Consumer):
    def __init__(self, stream: KafkaStream, group: str, on_assigned: PartitionsHook | None,
                 on_revoked: PartitionsHook | None) -> None:
        self._topic = stream.topic
        conf = stream._conf(**{
            "group.id": group, "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "session.timeout.ms": 10_000, "heartbeat.interval.ms": 3_000})
        if stream.instance_id:
            conf["group.instance.id"] = stream.instance_id
        self._c = _RdConsumer(conf)

        def assigned(_consumer, parts: list[TopicPartition]) -> None:
            if on_assigned:
                on_assigned({tp.partition for tp in parts})

        def revoked(_consumer, parts: list[TopicPartition]) -> None:
            if on_revoked:
                on_revoked({tp.partition for tp in parts})

        self._c.subscribe([stream.topic], on_assign=assigned, on_revoke=revoked, on_lost=revoked)

    def poll(self, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        try:
            # Wait for the first record only, then take what is already fetched: a full batch under
            # load, no waiting for one to fill when traffic is light.
            messages = self._c.consume(1, timeout_s)
            if messages and max_records > 1:
                messages += self._c.consume(max_records - 1, 0)
        except KafkaException as exc:
            raise StreamUnavailable(f"kafka poll failed: {exc}") from exc
        out = []
        for m in messages:
            err = m.error()
            if err is not None:
                if err.fatal():
                    raise StreamUnavailable(f"kafka consumer failed: {err.str()}")
                log.warning("kafka: %s", err.str())  # transient: librdkafka retries by itself
                continue
            kind, ts = m.timestamp()
            partition, offset = m.partition(), m.offset()
            assert partition is not None and offset is not None  # None only on a message that is an error
            # A consumed message's headers are a list of (name, bytes) pairs; the stubs' type is produce()'s.
            headers: Headers = tuple(m.headers() or ())  # type: ignore[arg-type]
            out.append(Record(m.value() or b"", partition, offset, m.key(), headers, ts if kind != 0 else None))
        return out

    def seek(self, partition: int, offset: int) -> None:
        if partition not in {tp.partition for tp in self._c.assignment()}:
            log.info("not seeking partition %d: no longer assigned", partition)
            return
        try:
            self._c.seek(TopicPartition(self._topic, partition, max(0, offset)))
        except KafkaException as exc:  # the caller keeps the records and retries
            raise StreamUnavailable(f"kafka seek of partition {partition} failed: {exc}") from exc

    def commit(self, offsets: Mapping[int, int]) -> None:
        if not offsets:
            return
        try:
            self._c.commit(offsets=[TopicPartition(self._topic, p, o) for p, o in offsets.items()],
                           asynchronous=False)
        except KafkaException as exc:
            raise StreamUnavailable(f"kafka commit failed: {exc}") from exc

    def highwaters(self) -> dict[int, int]:
        out = {}
        for tp in self._c.assignment():
            try:
                _, high = self._c.get_watermark_offsets(tp, cached=True)
            except KafkaException:
                continue
            if high >= 0:
                out[tp.partition] = high
        return out

    def close(self) -> None:
        self._c.close()
