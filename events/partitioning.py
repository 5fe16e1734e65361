"""Which partition a user's events go to — the one rule the producer, the store and serving share.

The stream keys each event by its user id, and librdkafka's default partitioner
(``consistent_random``: CRC-32 of the key, modulo the partition count) picks the partition; the
Kafka producer pins that partitioner by name (streams.kafka_stream) so a librdkafka
upgrade cannot move users. The Redis store tags a user's keys with the same number
(feature_store.online.redis_store), so one ingest batch of one partition touches one hash slot —
what Redis Cluster needs for one atomic script — and serving finds a user's keys from the id alone.
A producer with another partitioner (Java's default is murmur2) sends users elsewhere: the ingestor
dead-letters such records rather than write them where serving would never look.
"""

from __future__ import annotations

import zlib


def partition_of(user_id: str, partitions: int) -> int:
    """The partition (0 … partitions-1) of ``user_id``'s events: librdkafka's consistent_random."""
    if partitions < 1:
        raise ValueError("partitions must be >= 1")
    return zlib.crc32(user_id.encode()) % partitions
