"""`dinrec bench …` sub-commands (the peers live in the optional `bench` extra)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

bench_app = typer.Typer(help="Benchmarks that print JSON, the peer measured in the same run.", no_args_is_help=True)

# Every bench's: stdout stays the one JSON object, the stages go to stderr (training.progress).
Progress = Annotated[bool | None, typer.Option("--progress/--no-progress", help=(
    "a line per stage on stderr (default: when stderr is a terminal)"))]


@bench_app.callback()
def bench_options(
    isa: Annotated[str, typer.Option(help=(
        "native, or avx2: run as on a CPU without AVX-512 and AMX (dinrec's fused kernels off, PyTorch's, "
        "oneDNN's and MKL's dispatch capped at AVX2)"))] = "native",
) -> None:
    """Every bench's JSON names the machine (CPU, flags, torch/oneDNN, threads) and the code path taken."""
    import os
    import sys

    from dinrec.models.kernels import ISA_LIMIT_ENV, isa_environment

    try:
        env = isa_environment(isa)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--isa") from exc
    if env and os.environ.get(ISA_LIMIT_ENV) != isa:
        # PyTorch and oneDNN read their limits when they load: the bench runs again, in a process that
        # starts with them (and passes them on to the services it starts).
        argv = [a for i, a in enumerate(sys.argv) if not (a.startswith("--isa") or
                                                           (i > 0 and sys.argv[i - 1] == "--isa"))]
        os.execve(sys.executable, [sys.executable, "-m", "dinrec.cli.main", *argv[1:]], {**os.environ, **env})


def _print(result: dict, as_json: bool) -> None:
    """The result as JSON, naming the machine it ran on (benches that measure more of it say so)."""
    from dinrec.benchmarks.machine import machine

    result.setdefault("machine", machine())
    typer.echo(json.dumps(result, indent=None if as_json else 1))


def _tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


@bench_app.command("train")
def bench_train_cmd(
    data: Annotated[Path, typer.Option(help="dataset folder")],
    vs: Annotated[str | None, typer.Option(help="peer to run side by side: deepctr")] = None,
    epochs: int = 2, seq_len: Annotated[int, typer.Option("--seq-len")] = 50, batch_size: int = 1024,
    item_dim: int = 16, cat_dim: int = 16, attention_hidden: str = "80,40", mlp_hidden: str = "200,80",
    attention_activation: str = "dice", mlp_activation: str = "relu",
    seeds: Annotated[str, typer.Option(help="training seeds, e.g. 0,1,2,3,4: both sides train once per seed")] = "0",
    device: str = "auto",
    eval_negatives: Annotated[int, typer.Option(help="negatives per val/test positive")] = 20,
    objective: Annotated[str, typer.Option(help="dinrec's objective: listwise (the default's) or pointwise")] = (
        "listwise"),
    also_pointwise: Annotated[bool, typer.Option("--also-pointwise/--no-also-pointwise", help=(
        "with listwise: also dinrec's pointwise objective in the same run (the throughput before it)"))] = False,
    progress: Progress = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object (the default output)")] = True,
) -> None:
    """Train DIN on a dataset and report samples/s (a sample: a positive with its negatives), candidates/s,
    memory, test AUC/GAUC and, listwise, the training time to the peer's test GAUC (and the peer's)."""
    from dinrec.benchmarks.train_bench import bench_train

    if objective not in ("listwise", "pointwise"):
        raise typer.BadParameter("listwise or pointwise", param_hint="--objective")
    result = bench_train(data, vs=vs, epochs=epochs, seq_len=seq_len, batch_size=batch_size, item_dim=item_dim,
                         cat_dim=cat_dim, attention_hidden=_tuple(attention_hidden), mlp_hidden=_tuple(mlp_hidden),
                         attention_activation=attention_activation, mlp_activation=mlp_activation, seeds=_tuple(seeds),
                         device=device, eval_negatives=eval_negatives, objective=objective,
                         also_pointwise=also_pointwise, progress=progress)
    _print(result, as_json)


@bench_app.command("ingest")
def bench_ingest_cmd(
    events: Annotated[int, typer.Option(help="backlog size drained by each side")] = 200_000,
    users: int = 20_000, items: int = 50_000, partitions: int = 4,
    rate: Annotated[int, typer.Option(help="events/s produced during the latency phase")] = 20_000,
    seconds: Annotated[float, typer.Option(help="length of the latency phase")] = 10.0,
    progress: Progress = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object (the default output)")] = True,
) -> None:
    """Kafka → Redis: dinrec's exactly-once ingestor vs. the plain redis-py pipelined consumer
    (DINREC_KAFKA_BOOTSTRAP, DINREC_REDIS_URL; start them with deploy/local/services.sh)."""
    from dinrec.benchmarks.ingest_bench import bench_ingest
    from dinrec.feature_store.settings import FeatureStoreSettings

    fs = FeatureStoreSettings()
    result = bench_ingest(fs.kafka_bootstrap, fs.redis_url, events=events, users=users, items=items,
                          partitions=partitions, cap=fs.history_len, rate=rate, seconds=seconds,
                          progress=progress)
    _print(result, as_json)


@bench_app.command("score")
def bench_score_cmd(
    shape: Annotated[str, typer.Option(help="shipped: the DIN `dinrec train` ships by default, with its context "
                                            "(the size options do not apply); paper: the DIN paper's, of the sizes "
                                            "given")] = "shipped",
    candidates: Annotated[int | None, typer.Option(help="per request (default: 300 shipped, 200 paper)")] = None,
    seq_len: Annotated[int, typer.Option("--seq-len")] = 50, items: int = 100_000,
    item_dim: int = 32, cat_dim: int = 32, attention_hidden: str = "80,40", mlp_hidden: str = "200,80",
    attention_activation: str = "prelu", mlp_activation: str = "relu", requests: int = 500,
    vs: Annotated[str | None, typer.Option(help="peer: deepctr (default), none")] = "deepctr",
    compiled: Annotated[bool, typer.Option("--compiled/--no-compiled", help=(
        "shipped: also the listwise path through torch.compile (about a minute to compile)"))] = False,
    progress: Progress = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object (the default output)")] = True,
) -> None:
    """Latency of scoring one request (one history vs N candidates) on one thread, with the model `dinrec train`
    ships (or the DIN paper's): dinrec's scorer, the model's own path, and DeepCTR-Torch's DIN predict, in one run."""
    from dinrec.benchmarks.score_bench import bench_score

    if shape not in ("shipped", "paper"):
        raise typer.BadParameter("shipped or paper", param_hint="--shape")
    result = bench_score(shape=shape, candidates=candidates, seq_len=seq_len, items=items, item_dim=item_dim,
                         cat_dim=cat_dim, attention_hidden=_tuple(attention_hidden), mlp_hidden=_tuple(mlp_hidden),
                         attention_activation=attention_activation, mlp_activation=mlp_activation,
                         requests=requests, vs_deepctr=vs == "deepctr", compiled=compiled, progress=progress)
    _print(result, as_json)


@bench_app.command("serve")
def bench_serve_cmd(
    rps: Annotated[float, typer.Option(help="requests per second, sent open-loop")] = 400,
    seconds: float = 20, items: int = 100_000, users: int = 2000,
    seq_len: Annotated[int, typer.Option("--seq-len")] = 50,
    workers: Annotated[int | None, typer.Option(help="dinrec serve workers (default: its own default)")] = None,
    index: Annotated[str, typer.Option(help="recall index: auto (by catalog size), flat or hnsw")] = "auto",
    store: Annotated[str, typer.Option(help="redis: one server (DINREC_REDIS_URL); redis-cluster: that, then the "
                                            "same load on the cluster at --cluster-url, with the ratio")] = "redis",
    cluster_url: Annotated[str | None, typer.Option(
        envvar="DINREC_REDIS_CLUSTER_URL", help="a node of the Redis Cluster (for --store redis-cluster)")] = None,
    partitions: Annotated[int, typer.Option(help="shards of the store on the cluster (DINREC_STORE_PARTITIONS)")] = 8,
    vs: Annotated[str | None, typer.Option(help=(
        "fastapi: also the highest rate dinrec holds (p99 within --p99-ms, no errors) and the same search against "
        "a bare FastAPI app answering the same shape with the same workers: fraction_of_fastapi"))] = None,
    probe_seconds: Annotated[float, typer.Option(help="with --vs: seconds of load per probed rate")] = 5.0,
    p99_ms: Annotated[float, typer.Option("--p99-ms", help="with --vs: the p99 a held rate stays within")] = 25.0,
    progress: Progress = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object (the default output)")] = True,
) -> None:
    """The service under a fixed request rate: rps, p50/p95/p99, errors, degraded (DINREC_REDIS_URL); with
    --vs fastapi, the rate it holds against the framework's own ceiling on this box."""
    from dinrec.benchmarks.serve_bench import INDEX_KINDS, bench_serve
    from dinrec.feature_store.settings import FeatureStoreSettings

    if index not in INDEX_KINDS:
        raise typer.BadParameter(f"--index {index!r}: {', '.join(INDEX_KINDS)}")
    if store not in ("redis", "redis-cluster"):
        raise typer.BadParameter(f"--store {store!r}: redis or redis-cluster")
    if store == "redis-cluster" and not cluster_url:
        raise typer.BadParameter("--store redis-cluster needs --cluster-url (or DINREC_REDIS_CLUSTER_URL)")
    if vs not in (None, "fastapi"):
        raise typer.BadParameter(f"--vs {vs!r}: fastapi")
    result = bench_serve(FeatureStoreSettings().redis_url, rps=rps, seconds=seconds, items=items, users=users,
                         seq_len=seq_len, workers=workers, index=index,
                         cluster_url=cluster_url if store == "redis-cluster" else None, partitions=partitions,
                         vs=vs, probe_seconds=probe_seconds, p99_ms=p99_ms, progress=progress)
    _print(result, as_json)


@bench_app.command("store-size")
def bench_store_size_cmd(
    users: Annotated[int, typer.Option(help="synthetic users written through the store's script")] = 5000,
    behaviours: Annotated[int, typer.Option(help="behaviours per user (the history cap)")] = 50,
    items: Annotated[int, typer.Option(help="the catalog the behaviours are drawn from (Zipf-like)")] = 20_000,
    impressions: Annotated[int, typer.Option(help="impressions per user in an experiment (A/B keys)")] = 10,
    node_gb: Annotated[float, typer.Option(help="memory of one Redis node, for the projection")] = 26.0,
    fill: Annotated[float, typer.Option(help="the share of a node's memory the data may take")] = 0.6,
    progress: Progress = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object (the default output)")] = True,
) -> None:
    """Redis memory per user and per item (MEMORY USAGE of real keys, DINREC_REDIS_URL), and the cluster
    that 1M / 10M / 100M users with 1M items need."""
    from dinrec.benchmarks.store_size import measure, project
    from dinrec.feature_store.settings import FeatureStoreSettings

    measured = measure(FeatureStoreSettings().redis_url, users=users, behaviours=behaviours, items=items,
                       impressions=impressions, progress=progress)
    measured["projection"] = project(measured, users=[1_000_000, 10_000_000, 100_000_000], items=1_000_000,
                                     node_gb=node_gb, fill=fill)
    _print(measured, as_json)


@bench_app.command("overload")
def bench_overload_cmd(
    seconds: Annotated[float, typer.Option(help="how long the overload lasts")] = 30,
    overload: Annotated[float, typer.Option(help="offered load as a multiple of the measured capacity")] = 2.0,
    cap: Annotated[int, typer.Option(help="DINREC_MAX_IN_FLIGHT of the service")] = 8,
    items: int = 20_000, users: int = 2000,
    workers: Annotated[int | None, typer.Option(help="dinrec serve workers (default: its own default)")] = None,
    peer_seconds: Annotated[float, typer.Option(help="the same overload without the cap, as the peer")] = 10,
    slow_clients: Annotated[int | None, typer.Option(
        help="connections that send a POST's headers and then nothing, beside a second overload run "
             "(default 8 per worker)", min=0)] = None,
    progress: Progress = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object (the default output)")] = True,
) -> None:
    """The service past its capacity: good answers/s, accepted and shed p99, /healthz, recovery, and what
    slow clients cost it (Redis)."""
    from dinrec.benchmarks.serve_bench import bench_overload
    from dinrec.feature_store.settings import FeatureStoreSettings

    result = bench_overload(FeatureStoreSettings().redis_url, seconds=seconds, overload=overload, cap=cap,
                            items=items, users=users, workers=workers, peer_seconds=peer_seconds,
                            slow_clients=slow_clients, progress=progress)
    _print(result, as_json)


@bench_app.command("soak")
def bench_soak_cmd(
    minutes: Annotated[float, typer.Option(help="how long each store is soaked")] = 10,
    window_s: Annotated[float, typer.Option(help="seconds between memory and p99 readings")] = 30,
    store: Annotated[list[str] | None, typer.Option(help="memory and/or redis (repeatable; default both)")] = None,
    rps: Annotated[float | None, typer.Option(help="offered load (default: 0.8 of the capacity measured)")] = None,
    progress: Progress = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object (the default output)")] = True,
) -> None:
    """Random new user and item ids at a steady rate: memory (service RSS, Redis used_memory) and p99 over
    time, on the embedded store and on Redis."""
    from dinrec.benchmarks.soak_bench import bench_soak
    from dinrec.feature_store.settings import FeatureStoreSettings

    stores = tuple(store or ("memory", "redis"))
    if set(stores) - {"memory", "redis"}:
        raise typer.BadParameter(f"--store: memory or redis, not {sorted(set(stores) - {'memory', 'redis'})}")
    result = bench_soak(FeatureStoreSettings().redis_url, minutes=minutes, window_s=window_s, stores=stores, rate=rps,
                        progress=progress)
    _print(result, as_json)


@bench_app.command("ab")
def bench_ab_cmd(
    runs: Annotated[int, typer.Option(help="simulated experiments per scenario (A/A and A/B)")] = 2000,
    users: Annotated[int, typer.Option(help="users per arm")] = 20_000,
    looks: Annotated[int, typer.Option(help="times each experiment is analysed (after every batch)")] = 20,
    lift: Annotated[float, typer.Option(help="the A/B scenario's true relative CTR lift")] = 0.05,
    alpha: float = 0.05, seed: int = 0, progress: Progress = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object (the default output)")] = True,
) -> None:
    """False-positive rates of the A/B tests (fixed, fixed with peeking, sequential) and their power."""
    from dinrec.benchmarks.ab_bench import bench_ab

    result = bench_ab(runs=runs, users=users, looks=looks, lift=lift, alpha=alpha, seed=seed, progress=progress)
    _print(result, as_json)


@bench_app.command("e2e")
def bench_e2e_cmd(
    data: Annotated[Path, typer.Option(help="dataset folder")],
    seeds: Annotated[str, typer.Option(help="training seeds, e.g. 0,1,2: per-user differences are averaged over "
                                            "them before the standard error is taken across users")] = "0",
    users: Annotated[int | None, typer.Option(help="serve only the first N test users (all users train)")] = None,
    peers: Annotated[str, typer.Option(help="library peers to run beside it (comma-separated; none: '')")] = (
        "sasrec_rectools,bert4rec_rectools,ease_rectools"),
    own_sasrec: Annotated[bool, typer.Option(
        "--own-sasrec/--no-own-sasrec", help="also dinrec's own SASRec-style model (benchmarks/sasrec.py)")] = False,
    stage: Annotated[bool, typer.Option("--stage/--no-stage", help=(
        "also the ranking stage taken apart: DIN alone, without each signal, DIN over the catalog, the "
        "ceiling, and the gate's list"))] = True,
    progress: Progress = None,
    partial: Annotated[Path | None, typer.Option(help=(
        "after each seed, write the result so far here (a run stopped midway keeps what it measured)"))] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object (the default output)")] = True,
) -> None:
    """The served list (dinrec train's defaults, GET /recommend on the embedded store after the
    histories arrive through POST /events) against popularity, item-CF, the recall towers' own order and
    library peers (RecTools' SASRec, BERT4Rec and EASE; `make peers`), and the ranking stage taken apart,
    on the same leave-last-out split: HR@10, NDCG@10, HR@50, coverage, long-tail share, seen items in the
    list, per-user paired differences (vs dinrec and vs item-CF) with standard errors, pooled over seeds."""
    from dinrec.benchmarks.e2e_bench import bench_e2e
    from dinrec.benchmarks.peers import LIBRARY_PEERS

    chosen = [p.strip() for p in peers.split(",") if p.strip()]
    unknown = sorted(set(chosen) - set(LIBRARY_PEERS))
    if unknown:
        raise typer.BadParameter(f"unknown peers {unknown}; choose from {sorted(LIBRARY_PEERS)}", param_hint="--peers")
    result = bench_e2e(data, seeds=_tuple(seeds), max_users=users, peers=chosen, own_sasrec=own_sasrec, stage=stage,
                       progress=progress, partial=partial)
    _print(result, as_json)


@bench_app.command("recall")
def bench_recall_cmd(
    data: Annotated[Path | None, typer.Option(help="dataset folder")] = None,
    synthetic_items: Annotated[int, typer.Option(help="instead: the index on a synthetic catalog of this many "
                                                     "items (build time, size, p50/p99, recall vs exact)")] = 0,
    epochs: Annotated[int, typer.Option(help="DIN epochs (it ranks the final recommendations)")] = 3,
    recall_epochs: Annotated[int, typer.Option(help="recall towers' epochs (early-stopped on validation)")] = 20,
    seq_len: Annotated[int, typer.Option("--seq-len")] = 50, k: int = 10, seed: int = 0,
    progress: Progress = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object (the default output)")] = True,
) -> None:
    """HR@50/200/1000 of the FAISS recall stage beside item-to-item CF and popularity on the dataset's
    leave-one-out test split, and the long-tail share of the final recommendations."""
    from dinrec.benchmarks.recall_bench import bench_recall, bench_recall_scale

    if synthetic_items:
        result = bench_recall_scale(synthetic_items, seed=seed, progress=progress)
    elif data is None:
        raise typer.BadParameter("give --data DIR (or --synthetic-items N)", param_hint="--data")
    else:
        result = bench_recall(data, epochs=epochs, recall_epochs=recall_epochs, seq_len=seq_len, k=k, seed=seed,
                              progress=progress)
    _print(result, as_json)


@bench_app.command("retrain")
def bench_retrain_cmd(
    data: Annotated[Path, typer.Option(help="dataset folder (timestamps matter: the log is replayed in time)")],
    cut: Annotated[float, typer.Option(help="the first model's window ends at this quantile of time")] = 0.8,
    epochs: Annotated[int, typer.Option(help="DIN epochs")] = 2,
    recall_epochs: Annotated[int, typer.Option(help="recall towers' epochs")] = 10,
    seq_len: Annotated[int, typer.Option("--seq-len")] = 50, seed: int = 0,
    archive_span: Annotated[int | None, typer.Option(help=(
        "instead: the data phase (the window read from the archive, samples built) on an archive this many "
        "times the window's length against the window's alone: wall time and peak memory"))] = None,
    progress: Progress = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object (the default output)")] = True,
) -> None:
    """Scheduled retraining on a replayed log: the retrained candidate vs the stale champion on the
    gate's holdout, warm start vs training from scratch (the peer, same run), and the gate drills."""
    if archive_span is not None:
        from dinrec.benchmarks.window_bench import bench_window

        _print(bench_window(data, span=archive_span, progress=progress), as_json)
        return
    from dinrec.benchmarks.retrain_bench import bench_retrain

    result = bench_retrain(data, cut=cut, epochs=epochs, recall_epochs=recall_epochs, seq_len=seq_len, seed=seed,
                           progress=progress)
    _print(result, as_json)
