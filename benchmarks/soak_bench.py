"""`dinrec bench soak`: what clients that invent ids make the service and its store hold, over time.

For ``minutes``, on the embedded store and on Redis, the service gets a steady open-loop load (default:
0.8 of the capacity it measured on the same mix) in which every request names ids nobody used before:
half `GET /recommend` for a new user, half `POST /events` of a new user's views of new items in known
categories. Every ``window_s`` the bench reads the service's memory (RSS of its processes) and Redis'
(`used_memory`), and the window's p99. The store's windows are short here (dedup 60 s, a user's keys
120 s, popularity 60 s) so that the caps fill within the run: memory must then stay flat (its growth
in the second half of the run a small part of the first half's) and p99 within 20 % of the first
windows'. Not part of the test suite: a run is 2 × ``minutes``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal, TypedDict

import numpy as np

from dinrec.benchmarks import loadgen
from dinrec.benchmarks.loadgen import percentile, request_bytes
from dinrec.benchmarks.serve_bench import process_tree_stats, running_process, synthetic_bundle
from dinrec.retrieval.index import IndexSpec
from dinrec.serving.server import free_port
from dinrec.training.progress import Stages, showing

# Short windows, so that what invented ids make the store hold expires within the run.
SHORT_WINDOWS = {"DINREC_DEDUP_WINDOW_S": "60", "DINREC_ATTRIBUTION_WINDOW_S": "60",
                 "DINREC_USER_TTL_DAYS": str(120 / 86400), "DINREC_POPULARITY_WINDOW_H": str(60 / 3600)}


class _Window(TypedDict):
    """One window of a soak: its end, the memory held then, its latency and answers."""
    t_s: int
    rss_mb: float
    redis_used_mb: float | None  # None on the embedded store
    p99_ms: float | None  # None when nothing was answered
    ok_share: float
    errors: dict[str, int]


def _post(port: int, path: str, body: dict) -> bytes:
    data = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(data)}\r\n\r\n").encode() + data


def _fresh_requests(port: int, n: int, tag: str, categories: int, rng: np.random.Generator) -> list[bytes]:
    """``n`` requests, each naming a user (and, for events, items) never used before."""
    out = []
    now = time.time()
    for j in range(n):
        if j % 2 == 0:
            out.append(request_bytes("127.0.0.1", port, f"/recommend?user_id=soak-{tag}-{j}&k=10"))
        else:
            user = f"soak-{tag}-{j}"
            out.append(_post(port, "/events", {"events": [
                {"event_id": f"{user}-{e}", "user_id": user, "item_id": f"made-up-{tag}-{j}-{e}",
                 "category_id": f"c{int(rng.integers(1, categories + 1))}", "event_type": "view", "ts": now}
                for e in range(4)]}))
    return out


def _rss_mb(root: int) -> float:
    """Resident memory of ``root`` and its descendants (the service's supervisor and workers), MB."""
    page = os.sysconf("SC_PAGE_SIZE")
    return round(sum(int(f[21]) * page for f in process_tree_stats(root)) / 2**20, 1)


def _soak(kind: str, redis_url: str, *, minutes: float, window_s: float, rate: float | None, items: int,
          categories: int, seed: int, say: Callable[[str], None]) -> dict:
    import redis

    folder = Path(tempfile.mkdtemp(prefix="dinrec-bench-soak-"))
    bundle = synthetic_bundle(folder / "bundle", items, categories, 50, index=IndexSpec(kind="auto"))
    port, prefix = free_port(), f"soak-{os.getpid()}-{time.monotonic_ns()}"
    env = {**os.environ, **SHORT_WINDOWS, "DINREC_STORE": kind, "DINREC_REDIS_URL": redis_url,
           "DINREC_REDIS_PREFIX": prefix, "DINREC_EVENTS_SINK": "store", "DINREC_INGEST_IN_APP": "false",
           "DINREC_LOG_FORMAT": "text", "DINREC_CATALOG_POLL_S": "5"}
    if kind == "memory":
        env["DINREC_WORKERS"] = "1"  # the embedded store lives in one process
    r = redis.Redis.from_url(redis_url) if kind == "redis" else None
    used: Callable[[], float | None] = ((lambda: round(r.info("memory")["used_memory"] / 2**20, 1)) if r is not None
                                        else (lambda: None))
    rng = np.random.default_rng(seed)
    windows: list[_Window] = []
    try:
        with running_process([sys.executable, "-m", "dinrec.cli.main", "serve", "--bundle", str(bundle),
                              "--port", str(port)], port, folder / "serve.log", env) as proc:
            say(f"{kind}: service ready")
            probe = _fresh_requests(port, 4000, "probe", categories, rng)
            closed = loadgen.closed_loop("127.0.0.1", port, probe, concurrency=8, seconds=5)
            capacity = round(sum(o.status in (200, 202) for o in closed) / 5, 1)
            offered = rate or round(0.8 * capacity, 1)
            start_rss, start_used = _rss_mb(proc.pid), used()
            say(f"{kind}: capacity {capacity} rps, offering {offered}")
            n_windows = max(1, round(minutes * 60 / window_s))
            for w in range(n_windows):
                requests = _fresh_requests(port, int(offered * window_s) + 1, f"w{w}", categories, rng)
                outcomes = loadgen.run("127.0.0.1", port, requests, offered, window_s, timeout_s=2.0)
                ok = [o.latency_s * 1000 for o in outcomes if o.status in (200, 202)]
                windows.append({"t_s": round((w + 1) * window_s), "rss_mb": _rss_mb(proc.pid), "redis_used_mb": used(),
                                "p99_ms": percentile(ok, 99), "ok_share": round(len(ok) / max(len(outcomes), 1), 3),
                                "errors": dict(_kinds(outcomes))})
                last = windows[-1]
                say(f"{kind}: window {w + 1}/{n_windows} (rss {last['rss_mb']} MB, p99 {last['p99_ms']} ms)")
    finally:
        if r is not None:
            for key in r.scan_iter(f"{prefix}:*", count=1000):
                r.delete(key)
            r.close()
    half = len(windows) // 2
    first_p99 = [w["p99_ms"] for w in windows[:2] if w["p99_ms"] is not None]
    last_p99 = [w["p99_ms"] for w in windows[-2:] if w["p99_ms"] is not None]

    def growth(field: Literal["rss_mb", "redis_used_mb"], start: float | None) -> dict:
        if start is None or not windows:
            return {}
        mid, end = windows[half - 1][field] if half else start, windows[-1][field]
        assert mid is not None and end is not None  # measured in every window when it was at the start
        return {f"{field}_start": start, f"{field}_growth_first_half": round(mid - start, 1),
                f"{field}_growth_second_half": round(end - mid, 1)}

    return {"store": kind, "capacity_rps": capacity, "offered_rps": offered, "window_s": window_s,
            **growth("rss_mb", start_rss), **growth("redis_used_mb", start_used),
            "p99_ms_first": max(first_p99) if first_p99 else None, "p99_ms_last": max(last_p99) if last_p99 else None,
            "p99_last_vs_first": round(max(last_p99) / max(first_p99), 2) if first_p99 and last_p99 else None,
            "new_user_ids": int(sum(offered * window_s for _ in windows)), "windows": windows}


def _kinds(outcomes) -> dict[str, int]:
    from collections import Counter

    return Counter(o.failure or f"status {o.status}" for o in outcomes if o.status not in (200, 202))


def bench_soak(redis_url: str, *, minutes: float = 10, window_s: float = 30,
               stores: tuple[str, ...] = ("memory", "redis"), rate: float | None = None, items: int = 20_000,
               categories: int = 200, seed: int = 0, progress: bool | None = None) -> dict:
    """``progress``: a line per stage and per window on stderr (default: when stderr is a terminal)."""
    from dinrec.benchmarks.machine import machine

    say = Stages(showing(progress))
    runs = {kind: _soak(kind, redis_url, minutes=minutes, window_s=window_s, rate=rate, items=items,
                        categories=categories, seed=seed, say=say) for kind in stores}
    return {"minutes": minutes, "short_windows": SHORT_WINDOWS, "runs": runs, "machine": machine()}
