"""`dinrec bench ab`: how often the A/B statistics are wrong, by simulation (statistics only, no HTTP).

Each run simulates an experiment with two arms of ``users`` users each, arriving over ``looks``
batches. A user sees 1 + Poisson(``impressions``) items and clicks each with their own probability,
drawn from Beta with mean ``ctr`` (users differ, so impressions are not independent: the reason CTR
is analysed as a ratio metric over users), and converts (buys) Poisson(λ) times, λ their own rate
(Gamma with mean ``conversions``). Before the experiment the same users behaved the same way for a
pre-period (``pre_share`` of its length): the covariate CUPED adjusts by. After each batch the analysis
is run on the cumulative sums, as a team refreshing the dashboard would:

* ``aa_fpr_fixed`` — A/A, the fixed-horizon test looked at once, at the end: should be ≈ alpha;
* ``aa_fpr_fixed_peeking`` — A/A, the same test looked at after every batch, stopping at the first
  "significant": far above alpha — why the guardrail does not use it;
* ``aa_fpr_sequential`` — A/A, the confidence sequence looked at after every batch: ≤ alpha;
* ``power_fixed`` / ``power_sequential`` — the same with the treatment's CTR ``lift`` higher;
  (these five: CTR, unadjusted, the keys kept from before);
* ``metrics.{ctr,conversion}`` — the A/A rates for CTR and conversions per user;
* ``cuped.{ctr,conversion}`` — the same with CUPED, the variance it removed at the last look
  (1 − Var adjusted / Var plain, over the runs) and what the world's own ρ² says it should remove
  (``expected_variance_reduction``: measured on a million fresh users of the same world);
* ``results_ms_two_weeks`` — the results call (``GET /experiments/{name}/results`` through HTTP, the
  embedded store) of an experiment whose guardrail has snapshotted it every 30 s for two weeks: the
  median of 20 calls, with the snapshots kept (bounded: experiments.state).
"""

from __future__ import annotations

import json
import math
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypedDict

import numpy as np

from dinrec.experiments.stats import CupedMeanStat, CupedRatioStat, MeanStat, Moments, RatioStat, Stat, relative_effect
from dinrec.training.progress import Stages, showing


@dataclass(frozen=True)
class World:
    impressions: float = 10.0  # 1 + Poisson(this) a user in the experiment
    ctr: float = 0.05
    concentration: float = 20.0  # of the Beta users' CTRs are drawn from (smaller: users differ more)
    conversions: float = 0.3  # a user's mean conversions in the experiment
    conversion_shape: float = 0.5  # of the Gamma users' conversion rates are drawn from
    pre_share: float = 1.0  # the pre-period's length, as a share of the experiment's


def _users(rng: np.random.Generator, world: World, users: int, lift: float) -> dict[str, np.ndarray]:
    """Per-user counts in the experiment (n, c, b) and before it (n0, c0, b0)."""
    p = rng.beta(world.ctr * world.concentration, (1 - world.ctr) * world.concentration, users)
    rate = rng.gamma(world.conversion_shape, world.conversions / world.conversion_shape, users)
    n0 = rng.poisson(world.impressions * world.pre_share, users).astype(float)
    n = 1 + rng.poisson(world.impressions, users)
    return {"n": n.astype(float), "c": rng.binomial(n, np.clip(p * (1 + lift), 0, 1)).astype(float),
            "b": rng.poisson(rate * (1 + lift)).astype(float),
            "n0": n0, "c0": rng.binomial(n0.astype(int), p).astype(float),
            "b0": rng.poisson(rate * world.pre_share).astype(float)}


# The per-user quantities whose sums over users the four analyses need (x*y: the sum of products).
_TERMS = ("1", "n", "c", "b", "n0", "c0", "b0", "n*n", "c*c", "b*b", "n0*n0", "c0*c0", "b0*b0", "c*n", "c*c0",
          "c*n0", "n*c0", "n*n0", "c0*n0", "b*b0")


def _looks(rng: np.random.Generator, world: World, users: int, looks: int, lift: float) -> list[dict[str, float]]:
    """One arm's cumulative sums after each look."""
    u = _users(rng, world, users, lift)
    u["1"] = np.ones(users)
    batch = rng.integers(0, looks, users)
    cols = {}
    for term in _TERMS:
        x, _, y = term.partition("*")
        cols[term] = np.cumsum(np.bincount(batch, weights=u[x] * u[y] if y else u[x], minlength=looks))
    return [{t: float(col[k]) for t, col in cols.items()} for k in range(looks)]


def _m(s: dict[str, float], x: str) -> Moments:
    return Moments(int(s["1"]), s[x], s[f"{x}*{x}"])


def _stats(s: dict[str, float]) -> dict[str, Stat]:
    """The four analyses of one arm at one look."""
    return {
        "ctr": RatioStat(_m(s, "c"), _m(s, "n"), s["c*n"]),
        "conversion": MeanStat(_m(s, "b")),
        "ctr_cuped": CupedRatioStat(_m(s, "c"), _m(s, "n"), _m(s, "c0"), _m(s, "n0"),
                                    (s["c*n"], s["c*c0"], s["c*n0"], s["n*c0"], s["n*n0"], s["c0*n0"])),
        "conversion_cuped": CupedMeanStat(_m(s, "b"), _m(s, "b0"), s["b*b0"]),
    }


ANALYSES = ("ctr", "conversion", "ctr_cuped", "conversion_cuped")


class _Plan(TypedDict):
    """:func:`_run`'s experiment, the same for every run of a bench."""
    users: int
    looks: int
    alpha: float
    tuning_users: float


def _run(rng: np.random.Generator, world: World, lift: float, *, users: int, looks: int, alpha: float,
         tuning_users: float, analyses: tuple[str, ...]) -> dict[str, tuple]:
    """Per analysis: (fixed at the end, fixed at any look, sequential at any look, sequential says better at
    any look, the lift's variance at the end)."""
    a, b = _looks(rng, world, users, looks, 0.0), _looks(rng, world, users, looks, lift)
    stats_a, stats_b = [_stats(s) for s in a], [_stats(s) for s in b]
    out = {}
    for name in analyses:
        results = [relative_effect(stats_a[k][name], stats_b[k][name], "b", alpha=alpha, tuning_users=tuning_users)
                   for k in range(looks)]
        results = [r for r in results if not math.isnan(r.lift)]
        out[name] = (results[-1].significant, any(r.significant for r in results),
                     any(r.sequential != "inconclusive" for r in results),
                     any(r.sequential == "better" for r in results), results[-1].lift_se ** 2)
    return out


def expected_variance_reduction(world: World, users: int = 1_000_000, seed: int = 12345) -> dict[str, float]:
    """The world's own ρ²: the squared correlation, over a million fresh users, of each metric's per-user
    linearisation with its pre-period's (for a ratio m/d: (m − R·d) / d̄) — the share of the variance CUPED
    can remove."""
    u = _users(np.random.default_rng(seed), world, users, 0.0)

    def linear(m: np.ndarray, d: np.ndarray) -> np.ndarray:
        return (m - m.sum() / d.sum() * d) / d.mean()

    ctr = np.corrcoef(linear(u["c"], u["n"]), linear(u["c0"], u["n0"]))[0, 1]
    conversion = np.corrcoef(u["b"], u["b0"])[0, 1]
    return {"ctr": float(ctr**2), "conversion": float(conversion**2)}


def bench_ab(*, runs: int = 2000, users: int = 20_000, looks: int = 20, impressions: float = 10.0,
             ctr: float = 0.05, concentration: float = 20.0, lift: float = 0.05, alpha: float = 0.05,
             seed: int = 0, progress: bool | None = None) -> dict:
    """``progress``: a line per scenario on stderr (default: when stderr is a terminal)."""
    say = Stages(showing(progress))
    rng = np.random.default_rng(seed)
    world = World(impressions=impressions, ctr=ctr, concentration=concentration)
    kw: _Plan = {"users": users, "looks": looks, "alpha": alpha,
                 "tuning_users": 2 * users}  # tightest near the planned sample: both arms, full length
    t0 = time.perf_counter()
    aa = [_run(rng, world, 0.0, analyses=ANALYSES, **kw) for _ in range(runs)]
    say(f"a/a: {runs} experiments simulated, four analyses each (ctr fixed-test fpr "
        f"{np.mean([r['ctr'][0] for r in aa]):.3f})")
    ab = [_run(rng, world, lift, analyses=("ctr",), **kw)["ctr"] for _ in range(runs)]
    say(f"a/b: {runs} experiments simulated (fixed-test power {np.mean([r[0] for r in ab]):.3f})")

    def rate(x) -> dict:
        share = float(np.mean(x))
        return {"rate": round(share, 4), "se": round(math.sqrt(share * (1 - share) / len(x)), 4)}

    def column(analysis: str, i: int) -> list:
        return [r[analysis][i] for r in aa]

    def fprs(analysis: str) -> dict:
        return {"aa_fpr_fixed": rate(column(analysis, 0)), "aa_fpr_sequential": rate(column(analysis, 2))}

    two_weeks = results_ms_two_weeks()
    say(f"results call after two weeks of snapshots: {two_weeks['median_ms']} ms")
    expected = expected_variance_reduction(world)
    cuped = {}
    for metric in ("ctr", "conversion"):
        plain, adjusted = np.mean(column(metric, 4)), np.mean(column(f"{metric}_cuped", 4))
        cuped[metric] = {**fprs(f"{metric}_cuped"), "variance_reduction": round(float(1 - adjusted / plain), 4),
                         "expected_variance_reduction": round(expected[metric], 4)}
    return {
        "runs": runs, "users_per_arm": users, "looks": looks, "alpha": alpha,
        "aa_fpr_fixed": rate(column("ctr", 0)), "aa_fpr_fixed_peeking": rate(column("ctr", 1)),
        "aa_fpr_sequential": rate(column("ctr", 2)),
        "lift": lift, "power_fixed": rate([r[0] for r in ab]), "power_sequential": rate([r[3] for r in ab]),
        "metrics": {"ctr": fprs("ctr"), "conversion": fprs("conversion")},
        "cuped": cuped,
        "results_ms_two_weeks": two_weeks["median_ms"], "results_two_weeks": two_weeks,
        "world": {"impressions_per_user": 1 + impressions, "ctr": ctr, "beta_concentration": concentration,
                  **{k: v for k, v in asdict(world).items() if k.startswith(("conversion", "pre"))}},
        "seconds": round(time.perf_counter() - t0, 1),
    }


def results_ms_two_weeks(interval_s: float = 30.0, users_per_day: int = 20_000, seed: int = 0) -> dict:
    """Two weeks of guardrail snapshots (every ``interval_s``, the counts growing at ``users_per_day``) into
    the embedded store's experiment state, then the results call through a live service: its median time."""
    import httpx

    from dinrec.experiments import open_state
    from dinrec.experiments.stats import VariantSums
    from dinrec.feature_store.online.memory import MemoryStore
    from dinrec.feature_store.settings import FeatureStoreSettings
    from dinrec.serving.app import create_app
    from dinrec.serving.server import free_port, serve_in_thread
    from dinrec.serving.settings import ServingSettings
    from dinrec.streams.inprocess import InProcessStream

    rng = np.random.default_rng(seed)
    folder = Path(tempfile.mkdtemp(prefix="dinrec-bench-ab-"))
    experiment = {"name": "two-weeks", "status": "running", "variants": [{"name": "control"}, {"name": "b"}]}
    (folder / "experiments.json").write_text(json.dumps({"experiments": [experiment]}))
    store = MemoryStore()
    state = open_state(store)
    steps = int(14 * 86_400 / interval_s)
    start = time.time() - steps * interval_s
    totals = {v: np.zeros(6) for v in ("control", "b")}  # users, n, c, n², c², n·c
    per_step = users_per_day * interval_s / 86_400 / 2
    for k in range(steps):
        for arm in totals:
            users = rng.poisson(per_step)
            n = 1 + rng.poisson(10, users)
            c = rng.binomial(n, 0.05)
            totals[arm] += (users, n.sum(), c.sum(), (n * n).sum(), (c * c).sum(), (n * c).sum())
        state.snapshot("two-weeks", k, {"t": start + k * interval_s, "variants": {
            arm: asdict(VariantSums(int(x[0]), *map(float, x[1:]))) for arm, x in totals.items()}})
    kept = len(state.timeline("two-weeks"))
    settings = ServingSettings(registry=str(folder / "registry"), experiments_file=folder / "experiments.json")
    app = create_app(settings, FeatureStoreSettings(), store=store, stream=InProcessStream())
    port = free_port()
    with serve_in_thread(app, port, start_timeout_s=60), httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
        url = "/experiments/two-weeks/results"
        client.get(url).raise_for_status()  # warm
        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            answer = client.get(url)
            times.append(1000 * (time.perf_counter() - t0))
            answer.raise_for_status()
        body = answer.json()
    return {"median_ms": round(statistics.median(times), 2), "p90_ms": round(sorted(times)[17], 2),
            "snapshots_written": steps, "snapshots_kept": kept, "points_shown": len(body["timeline"]),
            "resolution": body["timeline_resolution"], "bytes": len(answer.content)}
