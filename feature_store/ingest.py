"""Ingestion: stream → validate → online store → commit.

The store write happens before the commit, so a crash in between redelivers the batch (the
stores absorb duplicates). A record that fails validation is never retried forever: it is
written to the dead-letter file (when configured) and logged, and ingestion goes on.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from feature_store.errors import InvalidEvent
from feature_store.online.base import OnlineStore
from feature_store.schema import BehaviourEvent
from feature_store.streams.base import Consumer, Record

log = logging.getLogger(__name__)


@dataclass
class IngestStats:
    consumed: int = 0
    stored: int = 0
    invalid: int = 0
    batches: int = 0


class DeadLetters:
    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None

    def add(self, record: Record, error: str) -> None:
        log.warning("dead-lettered record p%d@%d: %s", record.partition, record.offset, error)
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as fh:
            fh.write(json.dumps({"partition": record.partition, "offset": record.offset, "error": error,
                                 "value_b64": base64.b64encode(record.value).decode()}) + "\n")


def ingest_batch(records: list[Record], store: OnlineStore, dead: DeadLetters, stats: IngestStats) -> None:
    events = []
    for rec in records:
        try:
            events.append(BehaviourEvent.from_bytes(rec.value))
        except InvalidEvent as exc:
            stats.invalid += 1
            dead.add(rec, str(exc))
    stats.stored += store.write(events)
    stats.consumed += len(records)
    stats.batches += 1


def run_ingest(consumer: Consumer, store: OnlineStore, *, stop: threading.Event | None = None,
               max_records: int | None = None, idle_exit_s: float | None = None,
               dead_letter_path: str | Path | None = None, poll_timeout_s: float = 0.5) -> IngestStats:
    """Consume until ``stop`` is set, ``max_records`` are consumed, or nothing arrives for
    ``idle_exit_s`` seconds."""
    stats = IngestStats()
    dead = DeadLetters(dead_letter_path)
    last_data = time.monotonic()
    while not (stop is not None and stop.is_set()):
        if max_records is not None and stats.consumed >= max_records:
            break
        want = 500 if max_records is None else min(500, max_records - stats.consumed)
        records = consumer.poll(max_records=want, timeout_s=poll_timeout_s)
        if not records:
            if idle_exit_s is not None and time.monotonic() - last_data >= idle_exit_s:
                break
            continue
        last_data = time.monotonic()
        ingest_batch(records, store, dead, stats)
        consumer.commit()
    return stats
