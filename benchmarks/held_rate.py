"""The highest request rate a service holds: p99 within a bound and no errors, open loop.

A rate *holds* when ``probe_s`` seconds of open-loop load at it (benchmarks.loadgen: latency from each
request's scheduled send time) end with every request answered 200 within ``timeout_s`` and the p99
latency at most ``p99_ms``. The search doubles the rate from ``start_rps`` until one fails (or halves it
until one holds), then bisects between the last that held and the first that failed ``refine`` times.
The figure is the answered rate at the highest offered rate that held. Every probe is in the result, so
a reader sees how sharp the knee was; the same search on two services in one run makes their ratio.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from dinrec.benchmarks import loadgen


def held_rate(port: int, requests: Sequence[bytes], *, cpu_s: Callable[[], float], probe_s: float = 5.0,
              timeout_s: float = 1.0, p99_ms: float = 25.0, start_rps: float = 50.0, min_rps: float = 5.0,
              max_rps: float = 50_000.0, refine: int = 4, say: Callable[[str], None] = lambda _: None) -> dict:
    """{held_rps, held_offered_rps, held_p99_ms, probes, server_cpu_ms_per_request} for the service on
    ``port`` (``requests``: prepared request bytes, cycled); ``cpu_s``: the service's CPU seconds so far
    (all its processes), read around the search for its CPU per answered request."""
    probes: list[dict] = []

    def probe(rps: float) -> dict:
        results = loadgen.run("127.0.0.1", port, requests, rps, probe_s, timeout_s)
        ok = [r for r in results if r.status == 200 and r.latency_s <= timeout_s]
        p99 = loadgen.percentile([r.latency_s * 1000 for r in results], 99)
        row = {"offered_rps": round(rps, 1), "ok_rps": round(len(ok) / probe_s, 1), "p99_ms": p99,
               "errors": len(results) - len(ok), "answered": sum(r.status in (200, 503) for r in results)}
        row["held"] = row["errors"] == 0 and p99 is not None and p99 <= p99_ms
        probes.append(row)
        say(f"{rps:.0f} rps offered: p99 {p99} ms, {row['errors']} errors ({'held' if row['held'] else 'not held'})")
        return row

    cpu0 = cpu_s()
    best: dict | None = None
    failed: float | None = None
    rps = start_rps
    while rps <= max_rps:  # up by doubling while it holds
        row = probe(rps)
        if not row["held"]:
            failed = rps
            break
        best, rps = row, rps * 2
    if best is None:  # even the start failed: down by halving until one holds
        rps = start_rps / 2
        while rps >= min_rps:
            row = probe(rps)
            if row["held"]:
                best = row
                break
            failed, rps = rps, rps / 2
    if best is not None and failed is not None:
        lo, hi = best["offered_rps"], failed
        for _ in range(refine):
            mid = (lo + hi) / 2
            row = probe(mid)
            if row["held"]:
                best, lo = row, mid
            else:
                hi = mid
    cpu = cpu_s() - cpu0
    answered = sum(p["answered"] for p in probes) or 1
    return {"held_rps": best["ok_rps"] if best else 0.0, "held_offered_rps": best["offered_rps"] if best else None,
            "held_p99_ms": best["p99_ms"] if best else None, "p99_bound_ms": p99_ms, "probe_seconds": probe_s,
            "probes": probes, "server_cpu_ms_per_request": round(cpu * 1000 / answered, 3)}
