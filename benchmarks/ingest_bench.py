"""`dinrec bench ingest`: Kafka → Redis ingestion, dinrec's exactly-once ingestor against the
plain redis-py pipelined consumer (the obvious at-least-once loop: ZADD + ZINCRBY + trim per event,
no dedup, no offsets in the store), both measured in the same run on the same backlog.

* Throughput: a backlog of ``events`` records (synthetic users and Zipf items, 4 partitions) is
  produced first; after ``settle_s`` (the broker flushing it), each side drains it with one
  consumer in its own group, into its own key prefix, 500 records per poll and per store write;
  ``events_per_s`` = records / wall time from the first write to the last.
* Latency: a producer sends at ``rate`` events/s for ``seconds`` while dinrec's ingestor runs;
  per record, produce (the record's CreateTime) → the store write that made it visible returned.
* Where each drain's time goes: Redis' CPU and the bench process' CPU per event
  (``redis_cpu_us_per_event``, ``client_cpu_us_per_event``): the side near one core per event-rate bounds it.

Both sides parse every record into a validated BehaviourEvent, so the difference is the store
protocol. All processes (broker, Redis, bench) share this machine's cores.
"""

from __future__ import annotations

import gc
import os
import random
import statistics
import threading
import time
from collections.abc import Callable

import redis

from dinrec.events.features import is_behaviour
from dinrec.events.schema import BehaviourEvent
from dinrec.feature_store.ingest import Ingestor
from dinrec.feature_store.online.redis_store import SEP, RedisStore
from dinrec.streams.base import OutgoingRecord, Record, event_record
from dinrec.streams.kafka_stream import KafkaStream
from dinrec.training.progress import Stages, showing


def synthetic_records(n: int, users: int, items: int, seed: int = 0, start_ts: float = 1.7e9) -> list[OutgoingRecord]:
    rng = random.Random(seed)
    kinds = ["click"] * 8 + ["view", "buy"]
    return [event_record(BehaviourEvent(
        event_id=f"b{seed}-{i}", user_id=f"user{rng.randrange(users)}",
        item_id=f"item{min(int(rng.paretovariate(1.1)), items)}", category_id=f"c{rng.randrange(50)}",
        event_type=rng.choice(kinds), ts=start_ts + i * 0.01)) for i in range(n)]


def _produce(stream: KafkaStream, records: list[OutgoingRecord], chunk: int = 20_000) -> None:
    for i in range(0, len(records), chunk):
        stream.publish_raw(records[i:i + chunk])


def _drain_dinrec(stream: KafkaStream, store: RedisStore, group: str, n: int) -> dict:
    marks: list[tuple[float, int]] = []  # (when a batch was applied, records so far)

    def on_applied(batch: list[Record]) -> None:
        marks.append((time.perf_counter(), (marks[-1][1] if marks else 0) + len(batch)))

    ingestor = Ingestor(stream, store, group, on_applied=on_applied)
    try:
        stats = ingestor.run(max_records=n, poll_timeout_s=1.0)
    finally:
        ingestor.close()
    return {**_sustained(marks), "consumed": stats.consumed, "applied": stats.applied, "batches": stats.batches}


class CpuMeter:
    """What a drain costs each side, per event: Redis' CPU (its INFO, every thread of the server) and this
    process' (every thread: the ingestor's writer too) — which of the two bounds the rate."""

    def __init__(self, redis_url: str) -> None:
        self._r = redis.Redis.from_url(redis_url, decode_responses=True)

    def _redis_s(self) -> float:
        cpu = self._r.info("cpu")
        return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])

    def measure(self, drain: Callable[[], dict]) -> dict:
        """``drain``'s result, with the CPU each side spent per record it consumed."""
        redis0, client0 = self._redis_s(), time.process_time()
        out = drain()
        redis_s, client_s = self._redis_s() - redis0, time.process_time() - client0
        return {**out, "redis_cpu_us_per_event": round(redis_s / out["consumed"] * 1e6, 2),
                "client_cpu_us_per_event": round(client_s / out["consumed"] * 1e6, 2)}

    def close(self) -> None:
        self._r.close()


def _sustained(marks: list[tuple[float, int]]) -> dict:
    """Records/s from the first batch written to the last (group join and first fetch excluded)."""
    (t_first, n_first), (t_last, n_last) = marks[0], marks[-1]
    wall = t_last - t_first
    return {"events_per_s": round((n_last - n_first) / wall, 1), "seconds": round(wall, 3)}


def _drain_reference(stream: KafkaStream, redis_url: str, prefix: str, group: str, n: int, cap: int) -> dict:
    consumer = stream.consumer(group)
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    done = 0
    marks: list[tuple[float, int]] = []
    try:
        while done < n:
            records = consumer.poll(max_records=min(500, n - done), timeout_s=1.0)
            if not records:
                continue
            pipe = r.pipeline(transaction=False)
            users = set()
            for rec in records:
                e = BehaviourEvent.from_bytes(rec.value)
                if not is_behaviour(e.event_type, e.value):
                    continue
                pipe.zadd(f"{prefix}:hist:{e.user_id}", {SEP.join((e.event_id, e.item_id, e.category_id)): e.ts})
                pipe.zincrby(f"{prefix}:pop", 1, e.item_id)
                users.add(e.user_id)
            for u in users:
                pipe.zremrangebyrank(f"{prefix}:hist:{u}", 0, -(cap + 1))
            pipe.execute()
            consumer.commit({p: max(x.offset for x in records if x.partition == p) + 1
                             for p in {x.partition for x in records}})
            done += len(records)
            marks.append((time.perf_counter(), done))
    finally:
        consumer.close()
        r.close()
    return {**_sustained(marks), "consumed": done}


def _latency(stream: KafkaStream, store: RedisStore, group: str, rate: int, seconds: float, users: int,
             items: int) -> dict:
    ages: list[float] = []

    def on_applied(batch: list[Record]) -> None:
        now = time.time()
        ages.extend(now - r.timestamp_ms / 1000 for r in batch if r.timestamp_ms is not None)

    ingestor = Ingestor(stream, store, group, on_applied=on_applied)
    stop = threading.Event()
    consumer_thread = threading.Thread(target=ingestor.run, args=(stop,), kwargs={"poll_timeout_s": 0.1})
    consumer_thread.start()
    tick = 0.05
    per_tick = max(1, int(rate * tick))
    records = synthetic_records(int(rate * seconds), users, items, seed=1, start_ts=1.8e9)
    time.sleep(3.0)  # group join and the first fetch, not measured
    t0 = time.perf_counter()
    sent = 0
    for i in range(0, len(records), per_tick):
        stream.publish_raw(records[i:i + per_tick])
        sent += len(records[i:i + per_tick])
        ahead = t0 + (i // per_tick + 1) * tick - time.perf_counter()
        if ahead > 0:
            time.sleep(ahead)
    produce_s = time.perf_counter() - t0
    deadline = time.monotonic() + 60
    while len(ages) < sent and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    consumer_thread.join(timeout=60)
    ingestor.close()
    ms = sorted(a * 1000 for a in ages)
    return {"rate_target": rate, "rate_sent": round(sent / produce_s, 1), "measured": len(ms),
            "latency_p50_ms": round(statistics.median(ms), 2) if ms else None,
            "latency_p99_ms": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 2) if ms else None}


def bench_ingest(bootstrap: str, redis_url: str, *, events: int = 200_000, users: int = 20_000, items: int = 50_000,
                 partitions: int = 4, cap: int = 50, rate: int = 20_000, seconds: float = 10.0,
                 settle_s: float = 2.0, progress: bool | None = None) -> dict:
    """``progress``: a line per stage on stderr (default: when stderr is a terminal)."""
    say = Stages(showing(progress))
    run = f"bench{os.getpid()}-{int(time.time())}"
    topic = f"{run}.events"
    stream = KafkaStream(bootstrap, topic)
    stream.ensure_topic(partitions)
    records = synthetic_records(events, users, items)
    t0 = time.perf_counter()
    _produce(stream, records)
    produce_s = time.perf_counter() - t0
    say(f"backlog of {events} events produced")
    # Not kept: 200k live objects in this process would make every garbage collection during the
    # drains walk them, a cost no real consumer process has.
    del records
    # As `dinrec ingest` does once started: this process's imports (torch among them) out of the
    # collector's sight, or every full collection in the drains walks them (both sides alike).
    gc.collect()
    gc.freeze()
    store = RedisStore(redis_url, prefix=f"{run}-dinrec", history_cap=cap)
    meter = CpuMeter(redis_url)
    try:
        time.sleep(settle_s)  # the broker flushes what was just produced; not the consumers' cost
        dinrec = meter.measure(lambda: _drain_dinrec(stream, store, f"{run}-dinrec", events))
        say(f"dinrec drained the backlog ({dinrec['events_per_s']} events/s)")
        time.sleep(settle_s)
        reference = meter.measure(lambda: _drain_reference(stream, redis_url, f"{run}-ref", f"{run}-ref", events, cap))
        say(f"redis-py drained the backlog ({reference['events_per_s']} events/s)")
        latency = _latency(stream, store, f"{run}-latency", rate, seconds, users, items)
        say(f"latency phase done (p99 {latency['latency_p99_ms']} ms)")
        # Correctness of what was measured: both sides saw every event once; dinrec counted each once.
        applied = store.applied_behaviours()
    finally:
        meter.close()
        store.flush_prefix()
        store.close()
        RedisStore(redis_url, prefix=f"{run}-ref").flush_prefix()
        stream.close()
    return {
        "events": events, "users": users, "partitions": partitions, "history_cap": cap,
        "produce_events_per_s": round(events / produce_s, 1),
        "dinrec": {**dinrec, **latency, "behaviours_applied": applied},
        "redis_py_pipelined": reference,
        "events_per_s": dinrec["events_per_s"],
        "latency_p50_ms": latency["latency_p50_ms"], "latency_p99_ms": latency["latency_p99_ms"],
        "ratio_vs_reference": round(dinrec["events_per_s"] / reference["events_per_s"], 3),
        "cpus": os.cpu_count(),
    }
