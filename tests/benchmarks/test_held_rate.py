"""The held-rate search (benchmarks.held_rate) against a service whose knee is known: the generator is
replaced by one that answers every request in 5 ms up to ``capacity`` rps and times out the excess beyond
it, so where the search lands can be checked. The real generator and services: tests/test_bench.py."""

from __future__ import annotations

import pytest

from dinrec.benchmarks import held_rate as module
from dinrec.benchmarks.loadgen import Outcome


def _service(monkeypatch, capacity: float) -> list[float]:
    offered: list[float] = []

    def run(host, port, requests, rps, seconds, timeout_s):  # noqa: ANN001 - loadgen.run's signature
        offered.append(rps)
        n = int(rps * seconds)
        late = max(0, n - int(capacity * seconds))
        return ([Outcome(i / rps, 0.005, 200, False) for i in range(n - late)]
                + [Outcome(i / rps, 2.0, 0, False, "timeout") for i in range(late)])

    monkeypatch.setattr(module.loadgen, "run", run)
    return offered


def _search(**kw) -> dict:
    cpu = iter([10.0, 12.5])
    return module.held_rate(1, [b""], cpu_s=lambda: next(cpu), probe_s=2.0, **kw)


def test_the_search_doubles_then_bisects_to_the_knee(monkeypatch):
    offered = _service(monkeypatch, capacity=730)
    result = _search(start_rps=50, refine=5)
    assert offered[:6] == [50, 100, 200, 400, 800, 600]  # doubling until 800 fails, then halfway back
    assert 700 <= result["held_offered_rps"] <= 730 < 800  # 5 halvings of (400, 800]: within 12.5 of the knee
    assert result["held_rps"] == result["held_offered_rps"]  # every request answered at the rate that held
    held = [p for p in result["probes"] if p["held"]]
    assert all(p["errors"] == 0 and p["p99_ms"] <= 25 for p in held)
    assert all(p["errors"] > 0 for p in result["probes"] if not p["held"])
    assert result["held_offered_rps"] == max(p["offered_rps"] for p in held)
    answered = sum(p["answered"] for p in result["probes"])
    assert result["server_cpu_ms_per_request"] == pytest.approx(2500 / answered, abs=1e-3)


def test_a_start_above_the_knee_halves_until_a_rate_holds(monkeypatch):
    offered = _service(monkeypatch, capacity=30)
    result = _search(start_rps=100, refine=2)
    assert offered[:3] == [100, 50, 25]
    assert 25 <= result["held_offered_rps"] <= 30


def test_nothing_held_reads_zero_not_the_best_failure(monkeypatch):
    _service(monkeypatch, capacity=1)
    result = _search(start_rps=40, min_rps=5)
    assert result["held_rps"] == 0.0 and result["held_offered_rps"] is None
    assert [p["offered_rps"] for p in result["probes"]] == [40, 20, 10, 5]
