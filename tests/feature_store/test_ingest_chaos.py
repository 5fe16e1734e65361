"""`dinrec ingest` under kill -9, against a real Kafka broker and a real Redis server that is itself
killed and restarted from an older snapshot mid-stream, and a real Redis Cluster whose primaries are
killed mid-stream (their replicas take over): every history, every popularity count and every A/B
sum must come out exactly as computed independently from what was sent (0 lost, 0 applied twice)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import IO, Any, NamedTuple

import pytest

from dinrec.events.schema import BehaviourEvent
from dinrec.experiments import open_state
from dinrec.feature_store.online.redis_store import RedisStore
from dinrec.streams.kafka_stream import KafkaStream
from tests.conftest import REPO, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.redis, pytest.mark.slow]

N_USERS, PER_USER, CAP, PARTITIONS = 200, 100, 20, 4


class Sent(NamedTuple):
    events: list[BehaviourEvent]   # in the order they are produced, duplicates included
    duplicates: int
    late_duplicates: int           # sent after the user's history had moved past the original


def make_events(seed: int = 7, n_users: int = N_USERS, per_user_n: int = PER_USER) -> Sent:
    rng = random.Random(seed)
    per_user: list[list[BehaviourEvent]] = []
    for u in range(n_users):
        ts, evs = 1_700_000_000.0 + u, []
        shown: list[tuple[str, str]] = []  # (request, item) of this user's impressions so far
        ab: dict[str, Any]  # the event's experiment fields
        for j in range(per_user_n):
            if rng.random() > 0.05:  # 5%: the same timestamp as the previous event (a tie)
                ts += rng.choice([1.0, 2.5, 7.0])
            kind = rng.choices(["click", "view", "buy", "impression", "rate"], [60, 20, 5, 10, 5])[0]
            late = rng.random() < 0.05  # out of order: sent now, timestamped well before its neighbours
            item, ab = f"i{int(rng.paretovariate(1.2)) % 1500}", {}
            if kind == "impression":  # an experiment impression; users alternate between two variants
                ab = {"request_id": f"r{u}-{j // 5}", "experiment": "chaos", "variant": "AB"[u % 2], "position": 0}
                shown.append((ab["request_id"], item))
            elif kind == "click" and shown and rng.random() < 0.5:  # a click on something shown earlier
                request, item = rng.choice(shown)
                ab = {"request_id": request}
            elif kind == "click" and rng.random() < 0.05:  # a click naming a request never logged
                ab = {"request_id": f"lost-{u}-{j}"}
            evs.append(BehaviourEvent(
                event_id=f"u{u}-e{j}", user_id=f"u{u:03d}", item_id=item,
                category_id=f"c{rng.randrange(30)}", event_type=kind, ts=ts - (500.0 if late else 0.0),
                value=float(rng.randint(1, 5)) if kind == "rate" else None, **ab))
        per_user.append(evs)
    # Interleave users the way a live stream would, then add exact duplicates: half soon after the
    # original, half at the very end (far past the history cap of CAP).
    stream = [e for round_ in zip(*per_user, strict=True) for e in round_]
    soon = rng.sample(range(len(stream)), k=len(stream) // 40)
    at_end = rng.sample(range(len(stream) // 2), k=len(stream) // 40)
    for i in sorted(soon, reverse=True):
        stream.insert(min(len(stream), i + rng.randint(1, 50)), stream[i])
    originals = [stream[i] for i in at_end]
    return Sent(stream + originals, duplicates=len(soon) + len(at_end), late_duplicates=len(at_end))


def expected_state(events: list[BehaviourEvent]) -> tuple[dict[str, list[tuple]], Counter, int]:
    """What the store must hold, from the sent events alone: each (user, event id) once; interest
    events only (no impressions, ratings of 4+); ordered by (ts, event id); the newest CAP; popularity
    a (user, item) once (the run is shorter than the popularity window); and how many behaviours."""
    unique: dict[tuple[str, str], BehaviourEvent] = {}
    for e in events:
        unique.setdefault((e.user_id, e.event_id), e)
    kept = [e for e in unique.values()
            if e.event_type != "impression" and (e.event_type != "rate" or (e.value or 0) >= 4)]
    hist: dict[str, list[BehaviourEvent]] = {}
    for e in kept:
        hist.setdefault(e.user_id, []).append(e)
    histories = {u: [(e.ts, e.event_id, e.item_id, e.category_id)
                     for e in sorted(hs, key=lambda e: (e.ts, e.event_id))][-CAP:] for u, hs in hist.items()}
    return histories, Counter(item for _, item in {(e.user_id, e.item_id) for e in kept}), len(kept)


def expected_ab(events: list[BehaviourEvent]) -> tuple[dict[str, tuple], int]:
    """Per variant (users, Σn, Σc, Σn², Σc², Σn·c) and the orphan clicks, from the sent events alone:
    each (user, event id) once, in the order first sent (a user's events share a partition); a click
    counts once per impression, for the user shown it; a click with no impression to join (none logged
    yet, or its click counted) waits, an orphan, and is joined by the next impression of its request and
    item for its user."""
    seen: set[tuple[str, str]] = set()
    shown: dict[tuple[str | None, str], tuple[str | None, str]] = {}  # (request, item) -> (variant, user)
    waiting: dict[tuple[str | None, str], str] = {}  # (request, item) -> the user whose click came first
    per_user: dict[str, list] = {}
    orphans = 0
    for e in events:
        if (e.user_id, e.event_id) in seen:
            continue
        seen.add((e.user_id, e.event_id))
        key = (e.request_id, e.item_id)
        if e.event_type == "impression" and e.experiment:
            per_user.setdefault(e.user_id, [e.variant, 0, 0])[1] += 1
            if waiting.get(key) == e.user_id:
                del waiting[key]
                orphans -= 1
                per_user[e.user_id][2] += 1
            else:
                shown[key] = (e.variant, e.user_id)
        elif e.event_type == "click" and e.request_id:
            # Counted once per impression, and only for the user it was shown to.
            variant, shown_to = shown.get(key, (None, None))
            if shown_to != e.user_id:
                orphans += 1
                if key not in shown:
                    waiting.setdefault(key, e.user_id)
            else:
                del shown[key]
                per_user.setdefault(e.user_id, [variant, 0, 0])[2] += 1
    sums: dict[str, list[float]] = {}
    for variant, n, c in per_user.values():
        acc = sums.setdefault(variant, [0, 0, 0, 0, 0, 0])
        for k, x in enumerate((1, n, c, n * n, c * c, n * c)):
            acc[k] += x
    return {v: tuple(acc) for v, acc in sums.items()}, orphans


class Ingesters:
    """`dinrec ingest` subprocesses on one topic, group and store, each logging to its own file."""

    def __init__(self, folder: Path, redis_url: str, kafka_bootstrap: str, topic: str, *, store: str = "redis",
                 store_partitions: int = 1, **extra: str) -> None:
        self.folder = folder
        self.logs: list[IO[str]] = []
        self.env = {**os.environ, "DINREC_STORE": store, "DINREC_STORE_PARTITIONS": str(store_partitions),
                    "DINREC_STREAM": "kafka", "DINREC_REDIS_URL": redis_url,
                    "DINREC_KAFKA_BOOTSTRAP": kafka_bootstrap, "DINREC_TOPIC": topic, "DINREC_REDIS_PREFIX": topic,
                    "DINREC_CONSUMER_GROUP": f"{topic}-ingest", "DINREC_HISTORY_LEN": str(CAP),
                    # every item in popularity from its first user: the reference model counts (user, item)
                    # pairs, and admission has its own tests (test_store_conformance)
                    "DINREC_CATALOG_MIN_USERS": "1", **extra}

    def start(self) -> subprocess.Popen:
        self.logs.append((self.folder / f"ingest-{len(self.logs)}.log").open("w"))
        return subprocess.Popen([sys.executable, "-m", "dinrec.cli.main", "ingest"], cwd=REPO, env=self.env,
                                stdout=subprocess.PIPE, stderr=self.logs[-1], text=True)

    def log_of(self, n: int) -> str:
        return (self.folder / f"ingest-{n}.log").read_text()

    def stop_gracefully(self, proc: subprocess.Popen, n: int) -> None:
        """SIGTERM once it consumes (before its handler is set, SIGTERM would just kill it): exit 0."""
        wait_until(lambda: "consuming" in self.log_of(n), timeout_s=60, what=f"consumer {n} to start")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, self.log_of(n)[-3000:]
        assert "consumed" in json.loads(out.strip().splitlines()[-1])  # a clean exit prints its stats

    def kill_and_start(self, proc: subprocess.Popen) -> subprocess.Popen:
        """SIGKILL ``proc`` (no handler runs, nothing is flushed) and start the next consumer."""
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        return self.start()

    def drain(self, proc: subprocess.Popen, store: RedisStore, stream: KafkaStream, produced: threading.Event) -> None:
        """Once everything is produced, wait until the store holds every partition's end, then stop the
        last consumer (the ``len(logs) - 1``-th) gracefully."""
        wait_until(produced.is_set, timeout_s=120, what="the producer to finish")
        wait_for_the_end(store, stream, self.env["DINREC_TOPIC"])
        self.stop_gracefully(proc, len(self.logs) - 1)

    def close(self, *procs: subprocess.Popen) -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        for log in self.logs:
            log.close()


def produce_in_background(stream: KafkaStream, events: list[BehaviourEvent], chunk: int,
                          pause_s: float) -> threading.Event:
    done = threading.Event()

    def produce() -> None:
        for i in range(0, len(events), chunk):
            stream.publish(events[i:i + chunk])
            time.sleep(pause_s)
        done.set()

    threading.Thread(target=produce, daemon=True).start()
    return done


def wait_for_the_end(store: RedisStore, stream: KafkaStream, topic: str) -> None:
    ends = stream.end_offsets()
    wait_until(lambda: store.stream_offsets(topic) == {p: e - 1 for p, e in ends.items()}, timeout_s=180,
               interval_s=0.5, what="the store to reach the end of every partition")


def assert_store_holds_exactly(store: RedisStore, events: list[BehaviourEvent]) -> None:
    want_hist, want_pop, behaviours = expected_state(events)
    assert store.applied_behaviours() == behaviours
    got = store.histories(sorted(want_hist), CAP)
    mismatched = [u for u, hs in want_hist.items() if [tuple(h) for h in got[u]] != hs]
    assert not mismatched, f"{len(mismatched)} users differ, e.g. {mismatched[0]}"
    got_pop = dict(store.popular(10**6))
    wrong = {i: (got_pop.get(i), n) for i, n in want_pop.items() if got_pop.get(i) != n}
    assert not wrong and len(got_pop) == len(want_pop), f"{len(wrong)} items' counts differ: {list(wrong.items())[:5]}"
    want_ab, orphans = expected_ab(events)
    got_ab = {v: (s.users, s.impressions, s.clicks, s.impressions_sq, s.clicks_sq, s.cross)
              for v, s in open_state(store).sums("chaos").items()}
    assert got_ab == want_ab, f"experiment sums differ: {got_ab} != {want_ab}"
    assert open_state(store).unattributed() == {"orphan_clicks": orphans, "variant_conflicts": 0, "capped": 0}
    assert orphans > 0 and all(s[2] > 100 for s in want_ab.values())  # both kinds of click were exercised


def test_kill_minus_nine_loses_nothing_and_counts_nothing_twice(own_redis, kafka_bootstrap, unique, tmp_path):
    sent = make_events()
    assert len(sent.events) >= 20_000 and sent.duplicates >= 0.05 * (len(sent.events) - sent.duplicates)
    stream = KafkaStream(kafka_bootstrap, unique)
    assert stream.ensure_topic(PARTITIONS) == PARTITIONS
    # Static membership: a restarted consumer takes its partitions back at once, so six restarts fit.
    ingest = Ingesters(tmp_path, own_redis.url, kafka_bootstrap, unique, DINREC_CONSUMER_INSTANCE_ID="ingest-0")
    # The producer paces ~20k events over ~13 s, in the background, while we kill things.
    done = produce_in_background(stream, sent.events, chunk=400, pause_s=0.25)
    store = RedisStore(own_redis.url, prefix=unique, history_cap=CAP)
    rng = random.Random(3)
    kills = 0
    proc = ingest.start()
    redis_restarted = lost = False
    try:
        while kills < 6 or not done.is_set():
            time.sleep(rng.uniform(0.3, 3.0))
            if kills == 2 and not redis_restarted:
                # Snapshot, let ingestion move on, then kill Redis: it comes back behind the stream.
                own_redis.save()
                before = _applied(store, unique)
                wait_until(lambda b=before: _applied(store, unique) > b + 500, timeout_s=60,
                           what="ingestion past the snapshot")
                proc.send_signal(signal.SIGSTOP)  # hold the consumer so what Redis lost can be measured
                ahead = _applied(store, unique)
                own_redis.kill()
                proc.send_signal(signal.SIGCONT)
                time.sleep(1.0)  # the consumer fails and retries meanwhile
                proc.send_signal(signal.SIGSTOP)
                own_redis.start()
                lost = 0 <= _applied(store, unique) < ahead
                proc.send_signal(signal.SIGCONT)
                # The same consumer process must notice that Redis is behind and catch up by itself.
                wait_until(lambda a=ahead: _applied(store, unique) > a, timeout_s=60, what="recovery after the restart")
                redis_restarted = True
            proc = ingest.kill_and_start(proc)
            kills += 1
        ingest.drain(proc, store, stream, done)
    finally:
        ingest.close(proc)
        stream.close()

    assert kills >= 5 and redis_restarted and lost, "the scenario did not happen as planned"
    assert_store_holds_exactly(store, sent.events)
    assert expected_state(sent.events)[2] > 10_000  # the check covered the bulk of the stream
    store.close()


@pytest.mark.parametrize("kind", ["redis", "redis-cluster"])
def test_consumers_joining_leaving_and_stalling_apply_each_event_once(kind, request, kafka_bootstrap, unique, tmp_path):
    """Two consumers share the group (dynamic membership): B joins, A stalls past its session
    timeout holding a batch (a zombie: B owns its partitions when it wakes) and rejoins, B is
    killed and A takes everything back. Rebalances hand partitions over mid-stream each time. On one
    Redis in one shard; on the Redis Cluster in one shard per partition."""
    sent = make_events(seed=11, n_users=80, per_user_n=60)
    stream = KafkaStream(kafka_bootstrap, unique)
    stream.ensure_topic(PARTITIONS)
    cluster = kind == "redis-cluster"
    url = request.getfixturevalue("redis_cluster_url" if cluster else "redis_url")
    shards = PARTITIONS if cluster else 1
    ingest = Ingesters(tmp_path, url, kafka_bootstrap, unique, store=kind, store_partitions=shards,
                       DINREC_INGEST_BATCH="50")
    store = RedisStore(url, prefix=unique, history_cap=CAP, partitions=shards, cluster=cluster)
    done = produce_in_background(stream, sent.events, chunk=100, pause_s=0.5)  # ~25 s of traffic
    a = ingest.start()
    b = None
    try:
        time.sleep(2)
        b = ingest.start()
        wait_until(lambda: "consuming" in ingest.log_of(1), timeout_s=60, what="B to start")
        time.sleep(2)
        a.send_signal(signal.SIGSTOP)
        time.sleep(13)  # > the 10 s session timeout: the group gives A's partitions to B
        a.send_signal(signal.SIGCONT)
        time.sleep(3)
        assert not done.is_set(), "B must die mid-stream"
        b.send_signal(signal.SIGKILL)
        b.communicate(timeout=30)
        wait_until(done.is_set, timeout_s=120, what="the producer to finish")
        wait_for_the_end(store, stream, unique)  # A alone, after B's session expired
        ingest.stop_gracefully(a, 0)
    finally:
        ingest.close(a, *([b] if b else []))
        stream.close()
    # The hand-overs happened: A shared with B, B held all four while A stalled, A ended with all four.
    assert "partitions [0, 1, 2, 3] assigned" in ingest.log_of(1)
    assert ingest.log_of(0).count("] assigned") >= 3
    assert ingest.log_of(0).rsplit("] assigned", 1)[0].endswith("[0, 1, 2, 3")
    assert_store_holds_exactly(store, sent.events)
    store.flush_prefix()
    store.close()


def test_a_cluster_primary_killed_mid_stream_loses_nothing_and_counts_nothing_twice(own_cluster, kafka_bootstrap,
                                                                                    unique, tmp_path):
    """The failover drill: consumers SIGKILLed, and the primaries of two partitions' slots SIGKILLed
    mid-stream, one after the other; each replica takes over (automatically, after the node timeout)
    and the consumer carries on through the cluster client's slot-map refresh. Whatever the dead primary
    had acknowledged and not yet replicated is lost together with the offsets in its slot, so the
    consumer re-reads it: after the drain the store equals the expectation exactly."""
    sent = make_events(seed=5, n_users=120, per_user_n=80)
    stream = KafkaStream(kafka_bootstrap, unique)
    assert stream.ensure_topic(PARTITIONS) == PARTITIONS
    ingest = Ingesters(tmp_path, own_cluster.url, kafka_bootstrap, unique, store="redis-cluster",
                       store_partitions=PARTITIONS, DINREC_CONSUMER_INSTANCE_ID="ingest-0")
    store = RedisStore(own_cluster.url, prefix=unique, history_cap=CAP, partitions=PARTITIONS, cluster=True)
    done = produce_in_background(stream, sent.events, chunk=100, pause_s=0.5)  # ~50 s: both failovers mid-stream
    rng = random.Random(5)
    failovers: list[tuple[int, int]] = []  # (killed primary, new primary)
    kills = 0
    proc = ingest.start()
    try:
        while kills < 4 or not done.is_set():
            time.sleep(rng.uniform(0.5, 2.5))
            if kills in (1, 2) and len(failovers) < kills:
                tag = f"{unique}:{{{kills - 1}}}:pop"  # partition 0's slot, then partition 1's
                before = _applied(store, unique)
                wait_until(lambda b=before: _applied(store, unique) > b + 300, timeout_s=60,
                           what="ingestion to move on")
                dead = own_cluster.primary_of(tag)
                own_cluster.kill(dead)
                wait_until(lambda d=dead, t=tag: own_cluster.healthy() and own_cluster.primary_of(t) != d, timeout_s=60,
                           interval_s=0.2, what="a replica to take over the killed primary's slots")
                failovers.append((dead, own_cluster.primary_of(tag)))
                after = _applied(store, unique)
                wait_until(lambda a=after: _applied(store, unique) > a, timeout_s=60,
                           what="ingestion to carry on after the failover")
            proc = ingest.kill_and_start(proc)
            kills += 1
        ingest.drain(proc, store, stream, done)
    finally:
        ingest.close(proc)
        stream.close()
    assert len(failovers) == 2 and all(old != new for old, new in failovers), failovers
    assert kills >= 4
    assert_store_holds_exactly(store, sent.events)
    store.close()


def _applied(store: RedisStore, topic: str) -> int:
    try:
        return sum(o + 1 for o in store.stream_offsets(topic).values())
    except Exception:  # noqa: BLE001 - Redis may be down right now
        return -1
