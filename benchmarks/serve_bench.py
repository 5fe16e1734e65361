"""`dinrec bench serve`: the whole service under an open-loop load, on this machine.

A synthetic catalog of ``items`` items, with the model `dinrec train` ships by default (benchmarks.shipped:
its shape, random values — speed does not depend on training; recall index ``index``: auto, flat or hnsw),
is exported as a bundle; ``users`` users get histories of ``seq_len`` behaviours in the real Redis; ``dinrec serve``
runs as its own process(es) with ``workers``; benchmarks/loadgen.py sends ``GET /recommend`` at a
fixed rate for ``seconds`` — open loop: each request leaves at its scheduled time whether or not the
earlier ones have answered, and latency counts from that scheduled time (no coordinated omission).
Errors are non-200 answers and requests that took longer than ``timeout_s``.

With ``cluster_url`` the same load runs a second time, in the same run, against a Redis Cluster
(``DINREC_STORE=redis-cluster``, the store sharded by ``partitions``): both results and their ratio.

With ``vs="fastapi"`` the bench also searches the highest rate the service holds (p99 ≤ 25 ms, no errors;
benchmarks.held_rate), then the same search, same generator, same worker count, against a bare FastAPI app
answering a body of the same shape (benchmarks.fastapi_ceiling): the framework's ceiling on this box, and
dinrec's held rate as a fraction of it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal, TypedDict

import numpy as np

from dinrec.benchmarks import loadgen
from dinrec.benchmarks.held_rate import held_rate
from dinrec.benchmarks.loadgen import percentile, request_bytes
from dinrec.benchmarks.shipped import shipped_model
from dinrec.events.schema import BehaviourEvent
from dinrec.feature_store.online.redis_store import RedisStore
from dinrec.models.bundle import (
    BLEND_FILE,
    COVISIT_FILE,
    ITEM_COUNTS_FILE,
    ITEM_INDEX_FILE,
    ITEM_INDEX_INFO_FILE,
    write_bundle,
)
from dinrec.models.recall import RecallSpace
from dinrec.models.towers import Towers, TowersConfig
from dinrec.models.vocab import Vocab
from dinrec.retrieval.index import IndexSpec
from dinrec.serving.server import free_port
from dinrec.training.export import build_item_index, most_counted
from dinrec.training.progress import Stages, showing

IndexKind = Literal["auto", "flat", "hnsw"]  # IndexSpec.kind
INDEX_KINDS: tuple[IndexKind, ...] = ("auto", "flat", "hnsw")


def index_kind(index: str) -> IndexKind:
    """``index`` as an IndexSpec kind; an unknown one is refused (IndexSpec would build it as flat)."""
    for kind in INDEX_KINDS:
        if index == kind:
            return kind
    raise ValueError(f"index {index!r}: one of {', '.join(INDEX_KINDS)}")


class _ServiceShape(TypedDict):
    """:func:`_service`'s catalog, users and workers."""
    items: int
    categories: int
    users: int
    seq_len: int
    workers: int | None
    index: IndexKind


class _LoadShape(_ServiceShape):
    """:func:`_serve_once`'s: the service's and the load's."""
    rps: float
    seconds: float
    timeout_s: float
    warmup_s: float


def synthetic_bundle(out: Path, items: int, categories: int, seq_len: int, seed: int = 0,
                     index: IndexSpec | None = None) -> Path:
    """A bundle of the model `dinrec train` ships (benchmarks.shipped: its DIN, recall towers, co-visitation
    lane, training counts and ranking blend; random values) over ``items`` made-up items."""
    shipped = shipped_model(items, categories, seq_len, seed)
    model = shipped.model
    model.cfg = dataclasses.replace(model.cfg, extra={**model.cfg.extra, "seq_len": seq_len})
    item_category = shipped.item_category.numpy()
    vocab = Vocab(["<pad>", *(f"i{i}" for i in range(1, items + 1))],
                  ["<pad>", *(f"c{c}" for c in range(1, categories + 1))], item_category)
    towers = Towers(TowersConfig(n_items=items + 1, n_categories=categories + 1, seq_len=seq_len)).eval()
    built, info = build_item_index(RecallSpace(model, towers, item_category), index)
    popular = most_counted(vocab.items, shipped.counts)

    def writes(text: str) -> Callable[[Path], None]:
        def write(path: Path) -> None:
            path.write_text(text)
        return write

    def write_counts(path: Path) -> None:
        np.save(path, shipped.counts)

    extra: dict[str, Callable[[Path], None]] = {
        ITEM_INDEX_FILE: built.save, ITEM_INDEX_INFO_FILE: writes(json.dumps(info)), ITEM_COUNTS_FILE: write_counts,
        BLEND_FILE: writes(json.dumps(shipped.blend.to_json()))}
    if shipped.lane is not None:
        extra[COVISIT_FILE] = shipped.lane.save
    return write_bundle(out, model, vocab, {"seq_len": seq_len}, popular, towers=towers, extra_files=extra)


def load_histories(store: RedisStore, users: int, items: int, seq_len: int, seed: int = 1) -> None:
    rng = np.random.default_rng(seed)
    batch = []
    for u in range(users):
        for j, item in enumerate(rng.integers(1, items + 1, seq_len)):
            batch.append(BehaviourEvent(event_id=f"b{u}-{j}", user_id=f"u{u}", item_id=f"i{item}",
                                        category_id="c1", ts=1.7e9 + j))
        if len(batch) >= 5000:
            store.write(batch)
            batch = []
    store.write(batch)


def _requests(port: int, users: int) -> list[bytes]:
    return [request_bytes("127.0.0.1", port, f"/recommend?user_id=u{u}&k=10") for u in range(users)]


@dataclass(frozen=True)
class StoreSpec:
    """The Redis the service reads: one server (``cluster=False``) or a cluster, in ``partitions`` shards."""

    url: str
    cluster: bool = False
    partitions: int = 1

    @property
    def kind(self) -> str:
        return "redis-cluster" if self.cluster else "redis"


@contextlib.contextmanager
def _service(spec: StoreSpec, *, items: int, categories: int, users: int, seq_len: int, workers: int | None,
             index: IndexKind, env: dict[str, str] | None,
             say: Callable[[str], None] | None = None) -> Iterator[tuple[int, dict]]:
    """`dinrec serve` on a synthetic bundle and ``users`` histories in Redis; yields (port, index card).
    ``say``: told each stage (progress)."""
    say = say or Stages(False)
    run = f"bench-serve-{os.getpid()}-{time.monotonic_ns()}"
    folder = Path(tempfile.mkdtemp(prefix="dinrec-bench-serve-"))
    bundle = synthetic_bundle(folder / "bundle", items, categories, seq_len, index=IndexSpec(kind=index))
    index_info = json.loads((bundle / ITEM_INDEX_INFO_FILE).read_text())
    store = RedisStore(spec.url, prefix=run, history_cap=seq_len, partitions=spec.partitions, cluster=spec.cluster)
    load_histories(store, users, items, seq_len)
    say(f"bundle of {items} items exported, {users} histories loaded")
    port = free_port()
    env = {**os.environ, "DINREC_STORE": spec.kind, "DINREC_REDIS_URL": spec.url, "DINREC_REDIS_PREFIX": run,
           "DINREC_STORE_PARTITIONS": str(spec.partitions),
           # The lists' impressions go straight to the store: no stream to ingest (the in-process one has a
           # single partition, which a sharded store refuses to ingest from).
           "DINREC_EVENTS_SINK": "store", "DINREC_INGEST_IN_APP": "false", "DINREC_LOG_FORMAT": "text",
           **(env or {})}
    if workers:
        env["DINREC_WORKERS"] = str(workers)
    try:
        with running_process([sys.executable, "-m", "dinrec.cli.main", "serve", "--bundle", str(bundle),
                              "--port", str(port)], port, folder / "serve.log", env) as proc:
            say("service ready")
            yield port, {**index_info, **_served_paths(f"http://127.0.0.1:{port}"), "pid": proc.pid}
    finally:
        store.flush_prefix()
        store.close()


@contextlib.contextmanager
def running_process(args: list[str], port: int, log: Path, env: dict[str, str] | None = None
                    ) -> Iterator[subprocess.Popen]:
    """``args`` as a process writing to ``log``, yielded once its ``/readyz`` on ``port`` answers 200 (its
    log's tail in the error if it exits first); terminated on the way out."""
    with log.open("w") as out:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            _wait_ready(f"http://127.0.0.1:{port}", proc, log)
            yield proc
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def bench_serve(redis_url: str, *, rps: float = 400, seconds: float = 20, items: int = 100_000,
                categories: int = 1000, users: int = 2000, seq_len: int = 50, workers: int | None = None,
                timeout_s: float = 1.0, warmup_s: float = 3.0, index: str = "auto", cluster_url: str | None = None,
                partitions: int = 8, vs: str | None = None, probe_seconds: float = 5.0, p99_ms: float = 25.0,
                progress: bool | None = None) -> dict:
    """The service on one Redis server; with ``cluster_url``, then on the cluster under the same load:
    its result under ``redis_cluster`` and cluster/single ratios under ``cluster_vs_single``. With ``vs``
    "fastapi": the rate the service holds (``held_rps``, p99 ≤ ``p99_ms`` and no errors, each probe
    ``probe_seconds``), the bare FastAPI app's under ``fastapi``, and ``fraction_of_fastapi``. ``progress``:
    a line per stage on stderr (default: when stderr is a terminal)."""
    if vs not in (None, "fastapi"):
        raise ValueError(f"vs {vs!r}: fastapi or None")
    say = Stages(showing(progress))
    shape: _LoadShape = {"rps": rps, "seconds": seconds, "items": items, "categories": categories, "users": users,
                         "seq_len": seq_len, "workers": workers, "timeout_s": timeout_s, "warmup_s": warmup_s,
                         "index": index_kind(index)}
    single_spec = StoreSpec(redis_url)
    search = {"probe_s": probe_seconds, "timeout_s": timeout_s, "p99_ms": p99_ms} if vs else None
    single = {"store": single_spec.kind, **_serve_once(single_spec, say=say, search=search, **shape)}
    if search is not None:
        ceiling = _fastapi_ceiling(users, single["workers"], warmup_s, search, say)
        single["fastapi"] = ceiling
        single["fraction_of_fastapi"] = (round(single["held_rps"] / ceiling["held_rps"], 3) if ceiling["held_rps"]
                                         else None)
    if cluster_url is None:
        return single
    cluster_spec = StoreSpec(cluster_url, cluster=True, partitions=partitions)
    cluster = {"store": cluster_spec.kind, "partitions": partitions,
               **_serve_once(cluster_spec, say=say, **shape)}

    def ratio(field: str) -> float | None:
        a, b = cluster.get(field), single.get(field)
        return round(a / b, 3) if a is not None and b else None

    return {**single, "redis_cluster": cluster,
            "cluster_vs_single": {f: ratio(f) for f in ("rps", "p50_ms", "p99_ms", "server_cpu_ms_per_request")}}


def _serve_once(spec: StoreSpec, *, rps: float, seconds: float, items: int, categories: int, users: int,
                seq_len: int, workers: int | None, timeout_s: float, warmup_s: float, index: IndexKind,
                say: Callable[[str], None], search: dict | None = None) -> dict:
    """The fixed-rate run; with ``search`` (held_rate's bounds), then the held-rate search on the same
    service: its figure under ``held_rps``, the probes under ``held``."""
    def stage(what: str) -> None:
        say(f"{spec.kind}: {what}")

    with _service(spec, items=items, categories=categories, users=users, seq_len=seq_len, workers=workers,
                  index=index, env=None, say=stage) as (port, index_info):
        requests = _requests(port, users)
        loadgen.run("127.0.0.1", port, requests, min(rps, 100), warmup_s, timeout_s)  # warm-up, not measured
        stage("warm-up done")
        cpu0 = _tree_cpu_s(index_info["pid"])
        t0 = time.perf_counter()
        results = loadgen.run("127.0.0.1", port, requests, rps, seconds, timeout_s)
        wall = time.perf_counter() - t0
        cpu = _tree_cpu_s(index_info["pid"]) - cpu0
        stages = _stage_cpu_ms(f"http://127.0.0.1:{port}")
        held = (held_rate(port, requests, cpu_s=lambda: _tree_cpu_s(index_info["pid"]), say=stage, **search)
                if search is not None else None)
    ok = [r for r in results if r.status == 200 and r.latency_s <= timeout_s]
    answered = sum(r.status in (200, 503) for r in results) or 1
    per_request = cpu * 1000 / answered
    by_stage = {**stages, "other": round(per_request - sum(stages.values()), 3)} if stages else {}
    ms = [r.latency_s * 1000 for r in results]
    stage(f"load done ({len(ok) / wall:.1f} rps, p99 {percentile(ms, 99)} ms, {len(results) - len(ok)} errors)")
    return {"rps_target": rps, "rps": round(len(ok) / wall, 1), "requests": len(results),
            "p50_ms": percentile(ms, 50), "p95_ms": percentile(ms, 95), "p99_ms": percentile(ms, 99),
            "errors": len(results) - len(ok),
            "degraded": sum(r.degraded for r in results),
            "error_kinds": dict(Counter(
                r.failure or (f"status {r.status}" if r.status != 200 else "late") for r in results
                if not (r.status == 200 and r.latency_s <= timeout_s))),
            "workers": workers or os.cpu_count(),  # dinrec serve's default with Redis: one per CPU
            "index": index_info["kind"], "served_index": index_info["served_index"], "scorer": index_info["scorer"],
            "recall_at_200": index_info.get("recall_at_200", 1.0), "items": items, "users": users,
            "seq_len": seq_len, "cpus": os.cpu_count(),
            # The service's processes' CPU (workers, their threads, the supervisor) over the measured run, per
            # answered request; by stage from the workers' own accounting (the mean over a worker's life,
            # warm-up included); other: HTTP, middleware, the framework and background threads.
            "server_cpu_ms_per_request": round(per_request, 3), "cpu_ms_by_stage": by_stage,
            **({"held_rps": held["held_rps"], "held": held} if held is not None else {})}


def _fastapi_ceiling(users: int, workers: int, warmup_s: float, search: dict, say: Callable[[str], None]) -> dict:
    """The held-rate search against benchmarks.fastapi_ceiling under stock uvicorn with ``workers``."""
    import fastapi
    import uvicorn

    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="dinrec-bench-ceiling-")) / "uvicorn.log"

    def stage(what: str) -> None:
        say(f"fastapi ceiling: {what}")

    with running_process([sys.executable, "-m", "uvicorn", "dinrec.benchmarks.fastapi_ceiling:create_app", "--factory",
                          "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers), "--http",
                          "httptools", "--no-access-log", "--log-level", "warning"], port, log) as proc:
        requests = _requests(port, users)
        loadgen.run("127.0.0.1", port, requests, 100, warmup_s, search["timeout_s"])  # warm-up, not measured
        held = held_rate(port, requests, cpu_s=lambda: _tree_cpu_s(proc.pid), say=stage, **search)
    return {**held, "workers": workers, "app": "dinrec.benchmarks.fastapi_ceiling", "fastapi": fastapi.__version__,
            "uvicorn": uvicorn.__version__}


def _overloaded(port: int, health_port: int, requests: list[bytes], rps: float, seconds: float,
                timeout_s: float, cpu_s: Callable[[], float] | None = None,
                answer_cpu_ms: float | None = None) -> dict:
    """``rps`` open-loop for ``seconds`` with liveness probes beside it — on the liveness port (what k8s
    probes) and on the request port: what was answered, how fast. With ``cpu_s`` (the service's CPU seconds
    so far) and ``answer_cpu_ms`` (its CPU per answered request below capacity): the server CPU per 503,
    derived — the phase's CPU less its 200s at ``answer_cpu_ms`` each (the probes' share stays in), over
    the 503s."""
    cpu0 = cpu_s() if cpu_s is not None else 0.0
    with _HealthProbe(f"http://127.0.0.1:{health_port}") as probe, \
            _HealthProbe(f"http://127.0.0.1:{port}") as on_loop:
        results = loadgen.run("127.0.0.1", port, requests, rps, seconds, timeout_s)
    cpu_ms = (cpu_s() - cpu0) * 1000 if cpu_s is not None else None
    ok = [r.latency_s * 1000 for r in results if r.status == 200 and r.latency_s <= timeout_s]
    shed = [r.latency_s * 1000 for r in results if r.status == 503]
    answered = sum(r.status == 200 for r in results)  # late ones too: they cost the server as much
    shed_cpu = (round((cpu_ms - answered * answer_cpu_ms) / len(shed), 3)
                if cpu_ms is not None and answer_cpu_ms is not None and shed else None)
    return {"offered_rps": rps, "requests": len(results), "ok_rps": round(len(ok) / seconds, 1),
            "server_cpu_ms": round(cpu_ms, 1) if cpu_ms is not None else None, "answered": answered,
            "shed_cpu_ms_derived": shed_cpu,
            "accepted_p50_ms": percentile(ok, 50), "accepted_p99_ms": percentile(ok, 99), "shed": len(shed),
            "shed_p99_ms": percentile(shed, 99), "healthz_p99_ms": percentile(probe.latencies_ms, 99),
            "healthz_failed": probe.failed, "healthz_request_port_p99_ms": percentile(on_loop.latencies_ms, 99),
            "other_errors": dict(Counter(r.failure or f"status {r.status}" for r in results
                                         if r.status not in (200, 503) or r.latency_s > timeout_s))}


def bench_overload(redis_url: str, *, seconds: float = 30, overload: float = 2.0, cap: int = 8, items: int = 20_000,
                   users: int = 2000, workers: int | None = None, peer_seconds: float = 10,
                   timeout_s: float = 2.0, deadline_ms: int = 200, slow_clients: int | None = None,
                   progress: bool | None = None) -> dict:
    """The service's capacity (closed loop), then ``overload`` × that offered open-loop for ``seconds`` with
    the in-flight cap — once alone and once beside ``slow_clients`` connections (default 8 per worker) that
    send a POST's headers and then nothing, from other loopback addresses than the load — then half the
    capacity to see it recover; the peer is the same overload without the cap (DINREC_MAX_IN_FLIGHT=0), in
    the same run. ``progress``: a line per stage on stderr (default: when stderr is a terminal)."""
    from dinrec.benchmarks.machine import machine

    say = Stages(showing(progress))
    shape: _ServiceShape = {"items": items, "categories": 1000, "users": users, "seq_len": 50, "workers": workers,
                            "index": "auto"}
    health = free_port()
    settings = {"DINREC_REQUEST_DEADLINE_MS": str(deadline_ms), "DINREC_HEALTH_PORT": str(health)}
    with _service(StoreSpec(redis_url), env={**settings, "DINREC_MAX_IN_FLIGHT": str(cap)},
                  say=lambda what: say(f"capped: {what}"), **shape) as (port, served):
        requests = _requests(port, users)
        loadgen.run("127.0.0.1", port, requests, 100, 3, timeout_s)  # warm-up
        n_workers = workers or os.cpu_count() or 1
        # Connections land on whichever worker accepts first: with few, one worker may get them all and
        # the figure is half the service's; 4 per worker keep every worker busy.
        cpu_s = partial(_tree_cpu_s, served["pid"])
        cpu0 = cpu_s()
        closed = loadgen.closed_loop("127.0.0.1", port, requests, concurrency=4 * n_workers, seconds=5)
        closed_ok = sum(r.status == 200 for r in closed)
        answer_cpu_ms = (cpu_s() - cpu0) * 1000 / closed_ok if closed_ok else None
        capacity = round(closed_ok / 5, 1)
        say(f"capped: capacity {capacity} rps")
        capped = _overloaded(port, health, requests, overload * capacity, seconds, timeout_s, cpu_s, answer_cpu_ms)
        say(f"capped: overload done ({capped['ok_rps']} ok rps, accepted p99 {capped['accepted_p99_ms']} ms)")
        slow_n = 8 * n_workers if slow_clients is None else slow_clients
        with _SlowClients(port, slow_n) as slow:
            beside_slow = _overloaded(port, health, requests, overload * capacity, seconds, timeout_s)
        say(f"capped: overload beside {slow_n} slow clients done ({beside_slow['ok_rps']} ok rps)")
        after = loadgen.run("127.0.0.1", port, requests, capacity / 2, 5, timeout_s)
        after_ms = [r.latency_s * 1000 for r in after]
        recovered = all(r.status == 200 for r in after) and (percentile(after_ms, 99) or 0) <= 2 * deadline_ms
        say(f"capped: recovery {'seen' if recovered else 'not seen'} (p99 {percentile(after_ms, 99)} ms)")
    with _service(StoreSpec(redis_url), env={**settings, "DINREC_MAX_IN_FLIGHT": "0"},
                  say=lambda what: say(f"uncapped peer: {what}"), **shape) as (port, _):
        requests = _requests(port, users)
        loadgen.run("127.0.0.1", port, requests, 100, 3, timeout_s)
        uncapped = _overloaded(port, health, requests, overload * capacity, peer_seconds, timeout_s)
        say(f"uncapped peer: overload done ({uncapped['ok_rps']} ok rps)")
    return {"capacity_rps": capacity, "offered_rps": capped["offered_rps"], "slow_clients": slow_n,
            # what the load got beside the slow connections, and alone (the same offered rate)
            "ok_rps": beside_slow["ok_rps"], "ok_rps_without_slow_clients": capped["ok_rps"],
            "slow_clients_cost": round(1 - beside_slow["ok_rps"] / capped["ok_rps"], 3) if capped["ok_rps"] else None,
            "slow_connections_opened": slow.opened, "slow_connections_refused": dict(slow.answers),
            "ok_share_of_capacity": round(capped["ok_rps"] / capacity, 3) if capacity else None,
            "accepted_p99_ms": capped["accepted_p99_ms"], "shed_p99_ms": capped["shed_p99_ms"],
            # server CPU per 503, derived: the overload's CPU less its 200s at the capacity phase's CPU each
            "shed_cpu_ms": capped["shed_cpu_ms_derived"],
            "answer_cpu_ms": round(answer_cpu_ms, 3) if answer_cpu_ms is not None else None,
            "healthz_p99_ms": capped["healthz_p99_ms"], "recovered": recovered,
            "recovery_p99_ms": percentile(after_ms, 99), "cap": cap, "deadline_ms": deadline_ms, "seconds": seconds,
            "capped": capped, "capped_beside_slow_clients": beside_slow, "peer_uncapped": uncapped,
            "ok_rps_vs_peer": round(capped["ok_rps"] / uncapped["ok_rps"], 2) if uncapped["ok_rps"] else None,
            "workers": n_workers, "scorer": served["scorer"], "machine": machine()}


class _SlowClients:
    """``n`` connections from 127.0.0.2, 127.0.0.3, … (not the load's address: per-client limits must not
    be what saves the load) that each send a POST /events's headers with a Content-Length and then nothing,
    and open again once the service closes them (408): a slow-body attack kept up for as long as it runs."""

    def __init__(self, port: int, n: int) -> None:
        import threading

        self.port, self.n, self.opened = port, n, 0
        self.answers: Counter[str] = Counter()  # the status codes the service answered the slow ones with
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._hold, args=(j,), name=f"bench-slow-{j}", daemon=True)
                         for j in range(n)]

    def _hold(self, j: int) -> None:
        import socket

        source = f"127.0.0.{2 + j % 250}"
        head = (b"POST /events HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                b"content-length: 4096\r\n\r\n")
        while not self._stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1, source_address=(source, 0)) as conn:
                    conn.sendall(head)
                    self.opened += 1
                    while not self._stop.is_set():  # wait for the service to answer or close
                        try:
                            data = conn.recv(4096)
                        except TimeoutError:
                            continue
                        if data:
                            self.answers[data.split(b" ", 2)[1].decode("ascii", "replace")] += 1
                        break
            except OSError:
                self._stop.wait(0.05)

    def __enter__(self) -> _SlowClients:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5)


class _HealthProbe:
    """GET /healthz every 0.25 s on its own connection while the load runs (timeout 5 s, k8s' here)."""

    def __init__(self, base: str) -> None:
        import threading

        self.base, self.failed = base, 0
        self.latencies_ms: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-healthz", daemon=True)

    def _run(self) -> None:
        import httpx

        with httpx.Client(timeout=5) as client:
            while not self._stop.wait(0.25):
                t0 = time.perf_counter()
                try:
                    ok = client.get(self.base + "/healthz").status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.latencies_ms.append((time.perf_counter() - t0) * 1000)
                self.failed += not ok

    def __enter__(self) -> _HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)


def process_tree_stats(root: int) -> list[list[str]]:
    """The ``/proc/<pid>/stat`` fields after the command name (index 0: state; 11, 12: utime, stime in
    ticks; 21: rss in pages) of ``root`` and every process under it (Linux)."""
    stats: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stats[int(entry)] = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
    tree, grew = {root}, True
    while grew:
        more = {pid for pid, fields in stats.items() if int(fields[1]) in tree} - tree
        tree |= more
        grew = bool(more)
    return [stats[pid] for pid in tree if pid in stats]


def _tree_cpu_s(root: int) -> float:
    """User + system CPU seconds of ``root`` and every process under it, threads included."""
    tick = os.sysconf("SC_CLK_TCK")
    return sum((int(f[11]) + int(f[12])) / tick for f in process_tree_stats(root))


def _stage_cpu_ms(base: str, scrapes: int = 8) -> dict[str, float]:
    """Mean CPU ms per /recommend by stage, from dinrec_recommend_cpu_seconds_total over the 200s of
    the same scrape (each scrape reads one worker; the means of several are averaged)."""
    import re

    import httpx

    means: list[dict[str, float]] = []
    for _ in range(scrapes):
        text = httpx.get(base + "/metrics", timeout=5).text
        count = sum(float(v) for v in re.findall(
            r'dinrec_http_request_seconds_count\{route="/recommend",status="200"\} ([0-9.e+]+)', text))
        stages = {m[0]: float(m[1]) for m in re.findall(r'dinrec_recommend_cpu_seconds_total\{stage="([a-z]+)"\} '
                                                          r'([0-9.e+-]+)', text)}
        if count and stages:
            means.append({s: v * 1000 / count for s, v in stages.items()})
    if not means:
        return {}
    return {s: round(sum(m.get(s, 0.0) for m in means) / len(means), 3) for s in means[0]}


def _served_paths(base: str) -> dict:
    """The scoring implementation and recall index the service timed fastest at load (its
    dinrec_model_info metric); one worker's answer: every worker times its own, on the same CPU."""
    import re

    import httpx

    text = httpx.get(base + "/metrics", timeout=5).text
    out = {}
    for key, label in (("scorer", "scorer"), ("served_index", "recall_index")):
        match = re.search(rf'dinrec_model_info\{{[^}}]*{label}="([^"]+)"', text)
        out[key] = match.group(1) if match else None
    return out


def _wait_ready(base: str, proc: subprocess.Popen, log: Path, timeout_s: float = 180) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dinrec serve exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(base + "/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError("dinrec serve did not become ready")
