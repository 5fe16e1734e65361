"""`dinrec ingest …`: the stream → store consumer, its status, and the dead-letter topic."""

from __future__ import annotations

import gc
import json
import logging
import signal
import threading
import uuid
from pathlib import Path
from typing import Annotated, Literal

import typer

ingest_app = typer.Typer(help="Consume behaviour events from Kafka into the online store, exactly once in effect.",
                         invoke_without_command=True)


def _kafka_settings():
    from dinrec.feature_store.settings import FeatureStoreSettings

    settings = FeatureStoreSettings()
    if settings.stream == "inprocess":
        raise typer.BadParameter("the in-process stream lives inside one process; set DINREC_STREAM=kafka "
                                 "(the service ingests in-process streams itself)")
    return settings


@ingest_app.callback()
def ingest(
    ctx: typer.Context,
    max_records: Annotated[int | None, typer.Option(help="stop after this many records")] = None,
    idle_exit: Annotated[float | None, typer.Option(help="stop after this many idle seconds")] = None,
) -> None:
    """Consume until SIGTERM/SIGINT (finishing the batch in hand), retrying every store or broker
    failure with backoff. Run more of these with the same DINREC_CONSUMER_GROUP to scale out."""
    if ctx.invoked_subcommand is not None:
        return
    from dinrec.feature_store.ingest import Ingestor
    from dinrec.feature_store.online import open_store
    from dinrec.streams import open_stream

    logging.getLogger().setLevel(logging.INFO)  # a service: say what it does
    settings = _kafka_settings()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    store, stream = open_store(settings), open_stream(settings)
    stream.ensure_topic(settings.topic_partitions, settings.topic_replication)
    # The dead-letter topic too: where brokers do not create topics on first use, an invalid record
    # would otherwise fail its batch for ever and stall every partition behind it.
    dead = stream.dead_letters()
    try:
        dead.ensure_topic(1, settings.topic_replication)
    finally:
        dead.close()
    ingestor = Ingestor(stream, store, settings.consumer_group, batch_size=settings.ingest_batch)
    server = None
    if settings.ingest_metrics_port is not None:
        from dinrec.feature_store.ingest_http import serve_stats

        server = serve_stats(ingestor.stats, settings.ingest_metrics_port, settings.ingest_metrics_host)
    # What start-up made (~70k objects: the CLI, pydantic, the clients) moves out of the collector's
    # sight, or every full collection walks it; with torch imported (~190k) that was a quarter of this
    # loop's time on a 2-core box (docs/benchmarks.md#ingestion-throughput). Serving does the same.
    gc.collect()
    gc.freeze()
    try:
        stats = ingestor.run(stop, max_records=max_records, idle_exit_s=idle_exit)
    finally:
        ingestor.close()
        stream.close()
        store.close()
        if server is not None:
            server.shutdown()
    typer.echo(json.dumps(stats.snapshot()))


@ingest_app.command("status")
def status(
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    metrics_url: Annotated[str | None, typer.Option(
        help="also read a running consumer's counters, e.g. http://127.0.0.1:9108")] = None,
) -> None:
    """Lag per partition (the topic's end vs. what the store has applied), dead letters, and
    optionally a running consumer's counters."""
    from dinrec.feature_store.online import open_store
    from dinrec.streams import open_stream

    settings = _kafka_settings()
    store, stream = open_store(settings), open_stream(settings)
    try:
        ends, applied = stream.end_offsets(), store.stream_offsets(settings.topic)
        dead = stream.dead_letters().end_offsets()
        eviction = store.eviction_problem()
    finally:
        stream.close()
        store.close()
    parts = {str(p): {"end": end, "applied": applied.get(p, -1), "lag": end - applied.get(p, -1) - 1}
             for p, end in sorted(ends.items())}
    out: dict = {"topic": settings.topic, "group": settings.consumer_group, "partitions": parts,
                 "lag": sum(v["lag"] for v in parts.values()), "dead_letters": sum(dead.values()),
                 "eviction": eviction}
    if metrics_url:
        import httpx

        out["consumer"] = httpx.get(metrics_url.rstrip("/") + "/status", timeout=5).json()
    if as_json:
        typer.echo(json.dumps(out))
        return
    typer.echo(f"topic {out['topic']} (group {out['group']}): lag {out['lag']}, dead letters {out['dead_letters']}")
    if eviction:
        typer.echo(f"  WARNING: {eviction}")
    for p, v in parts.items():
        typer.echo(f"  partition {p}: end {v['end']}, applied through {v['applied']}, lag {v['lag']}")


@ingest_app.command("dlq")
def dlq(
    limit: Annotated[int, typer.Option(help="show at most this many")] = 20,
    replay: Annotated[bool, typer.Option(
        "--replay", help="publish the dead letters not yet replayed back to the topic (after a fix)")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per dead letter")] = False,
) -> None:
    """Show the dead-letter topic (reason, source, original bytes), or replay it."""
    from dinrec.feature_store.ingest import ERROR_HEADER, SOURCE_HEADER
    from dinrec.streams import open_stream
    from dinrec.streams.base import OutgoingRecord

    settings = _kafka_settings()
    stream = open_stream(settings)
    dead = stream.dead_letters()
    # Showing reads from the start in a throwaway group; replaying commits, so nothing is replayed twice.
    group = f"{settings.consumer_group}.dlq-replay" if replay else f"dinrec-dlq-view-{uuid.uuid4().hex[:8]}"
    consumer = dead.consumer(group)
    try:
        seen = 0
        while replay or seen < limit:
            records = consumer.poll(max_records=500 if replay else limit - seen, timeout_s=3.0)
            if not records:
                break
            if replay:
                stream.publish_raw([OutgoingRecord(r.value, r.key, tuple(h for h in r.headers
                                                                       if h[0] not in (ERROR_HEADER, SOURCE_HEADER)))
                                    for r in records])
                consumer.commit({p: max(r.offset for r in records if r.partition == p) + 1
                                 for p in {r.partition for r in records}})
                seen += len(records)
                continue
            for r in records:
                headers = dict(r.headers)
                source = headers.get(SOURCE_HEADER, b"").decode()
                error = headers.get(ERROR_HEADER, b"").decode(errors="replace")
                value = r.value[:2000].decode(errors="replace")
                row = {"source": source, "error": error, "value": value, "bytes": len(r.value)}
                seen += 1
                text = f"{source}  {error}\n    {value[:200]!r}"
                typer.echo(json.dumps(row) if as_json else text)
    finally:
        consumer.close()
        dead.close()
        stream.close()
    if replay:
        typer.echo(json.dumps({"replayed": seen, "topic": settings.topic}))


@ingest_app.command("backfill")
def backfill(
    data: Annotated[Path, typer.Option(help="a dataset folder or events.jsonl (any layout `dinrec data info` knows)")],
    to: Annotated[Literal["stream", "store"], typer.Option(
        help="publish to the stream (the consumers apply it), or write straight into the store")] = "stream",
    limit: Annotated[int, typer.Option(help="only the first N events (0: all)")] = 0,
    chunk: Annotated[int, typer.Option(help="events per publish / store write")] = 5000,
) -> None:
    """Load a dataset's events so a new deployment starts warm. Event ids are derived from the
    dataset and row, so running it again applies nothing twice (within the dedup window)."""
    from tqdm import tqdm

    from dinrec.datasets import load_dataset
    from dinrec.feature_store.online import open_store
    from dinrec.feature_store.settings import FeatureStoreSettings
    from dinrec.streams import open_stream

    settings = _kafka_settings() if to == "stream" else FeatureStoreSettings()
    if to == "store" and settings.store == "memory":
        raise typer.BadParameter("the memory store lives inside one process; set DINREC_STORE=redis")
    dataset = load_dataset(data)
    total = min(len(dataset), limit) if limit else len(dataset)
    sink_stream = open_stream(settings) if to == "stream" else None
    sink_store = open_store(settings) if to == "store" else None
    applied = 0
    try:
        if sink_stream is not None:
            sink_stream.ensure_topic(settings.topic_partitions, settings.topic_replication)
        with tqdm(total=total, unit="ev", desc=f"backfill → {to}", disable=None) as bar:
            batch = []
            for i, event in enumerate(dataset.events()):
                if i >= total:
                    break
                batch.append(event)
                if len(batch) == chunk or i == total - 1:
                    if sink_stream is not None:
                        sink_stream.publish(batch)
                    elif sink_store is not None:
                        applied += sink_store.write(batch)
                    bar.update(len(batch))
                    batch = []
    finally:
        if sink_stream is not None:
            sink_stream.close()
        if sink_store is not None:
            sink_store.close()
    out = {"events": total, "to": to, "topic" if to == "stream" else "store":
           settings.topic if to == "stream" else settings.store}
    if to == "store":
        out["applied"] = applied
    typer.echo(json.dumps(out))


@ingest_app.command("archive")
def archive(
    out: Annotated[str, typer.Option(help="archive root, a folder or s3://bucket/prefix: "
                                          "{out}/{topic}/date=…/hour=…/p{partition}-….jsonl")],
    group: Annotated[str, typer.Option(help="the archive's own consumer group")] = "dinrec-archive",
    max_records: Annotated[int | None, typer.Option(help="stop after archiving this many records")] = None,
    idle_exit: Annotated[float | None, typer.Option(help="stop after this many idle seconds")] = None,
    file_records: Annotated[int, typer.Option(help="records per file at most")] = 10_000,
    file_age: Annotated[float, typer.Option(help="seconds a partition's open file may wait")] = 60.0,
) -> None:
    """Write the stream (behaviours, impressions, clicks) to time-partitioned JSON-lines files,
    each record exactly once: the training data of record, beyond Kafka's retention. An outage of
    the storage or the broker is waited out with backoff (counted as retries)."""
    from dinrec.streams import open_stream
    from dinrec.streams.archive import Archiver

    logging.getLogger().setLevel(logging.INFO)  # a service: say what it does
    settings = _kafka_settings()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stream = open_stream(settings)
    archiver = Archiver(stream, out, group, max_file_records=file_records, max_file_age_s=file_age)
    try:
        stats = archiver.run(stop, max_records=max_records, idle_exit_s=idle_exit)
    finally:
        archiver.close()
        stream.close()
    typer.echo(json.dumps({"records": stats.records, "files": stats.files, "redelivered": stats.redelivered,
                           "retries": stats.retries}))
