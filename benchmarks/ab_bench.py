"""`dinrec bench ab`: how often the A/B statistics are wrong, by simulation (statistics only, no HTTP).

Each run simulates an experiment with two arms of ``users`` users each, arriving over ``looks``
batches. A user sees 1 + Poisson(``impressions``) items and clicks each with their own probability,
drawn from Beta with mean ``ctr`` (users differ, so impressions are not independent: the reason CTR
is analysed as a ratio metric over users). After each batch the analysis is run on the cumulative
sums, as a team refreshing the dashboard would:

* ``aa_fpr_fixed`` — A/A, the fixed-horizon test looked at once, at the end: should be ≈ alpha;
* ``aa_fpr_fixed_peeking`` — A/A, the same test looked at after every batch, stopping at the first
  "significant": far above alpha — why the guardrail does not use it;
* ``aa_fpr_sequential`` — A/A, the confidence sequence looked at after every batch: ≤ alpha;
* ``power_fixed`` / ``power_sequential`` — the same with the treatment's CTR ``lift`` higher.
"""

from __future__ import annotations

import math
import time

import numpy as np

from experiments.stats import VariantSums, compare
from training.progress import Stages, showing


def _arm(rng: np.random.Generator, users: int, looks: int, impressions: float, ctr: float, concentration: float,
         lift: float) -> list[VariantSums]:
    """Cumulative sums after each look for one arm."""
    batch = rng.integers(0, looks, users)
    n = 1 + rng.poisson(impressions, users)
    p = rng.beta(ctr * concentration, (1 - ctr) * concentration, users) * (1 + lift)
    c = rng.binomial(n, np.clip(p, 0, 1))
    cols = [np.cumsum(np.bincount(batch, weights=w, minlength=looks))
            for w in (np.ones(users), n, c, n * n, c * c, n * c)]
    return [VariantSums(int(cols[0][k]), *(float(col[k]) for col in cols[1:])) for k in range(looks)]


def _run(rng: np.random.Generator, lift: float, *, users: int, looks: int, impressions: float, ctr: float,
         concentration: float, alpha: float, tuning_users: float) -> tuple[bool, bool, bool, bool]:
    """(fixed at the end, fixed at any look, sequential at any look, sequential says better at any look)."""
    a = _arm(rng, users, looks, impressions, ctr, concentration, 0.0)
    b = _arm(rng, users, looks, impressions, ctr, concentration, lift)
    results = [compare(a[k], b[k], "b", alpha=alpha, tuning_users=tuning_users) for k in range(looks)]
    results = [r for r in results if not math.isnan(r.lift)]
    return (results[-1].significant, any(r.significant for r in results),
            any(r.sequential != "inconclusive" for r in results), any(r.sequential == "better" for r in results))


def bench_ab(*, runs: int = 2000, users: int = 20_000, looks: int = 20, impressions: float = 10.0,
             ctr: float = 0.05, concentration: float = 20.0, lift: float = 0.05, alpha: float = 0.05,
             seed: int = 0, progress: bool | None = None) -> dict:
    """``progress``: a line per scenario on stderr (default: when stderr is a terminal)."""
    say = Stages(showing(progress))
    rng = np.random.default_rng(seed)
    kw = dict(users=users, looks=looks, impressions=impressions, ctr=ctr, concentration=concentration, alpha=alpha,
              tuning_users=2 * users)  # tightest near the planned sample: both arms, full length
    t0 = time.perf_counter()
    aa = np.array([_run(rng, 0.0, **kw) for _ in range(runs)])
    say(f"a/a: {runs} experiments simulated (fixed-test fpr {aa[:, 0].mean():.3f})")
    ab = np.array([_run(rng, lift, **kw) for _ in range(runs)])
    say(f"a/b: {runs} experiments simulated (fixed-test power {ab[:, 0].mean():.3f})")

    def rate(x: np.ndarray) -> dict:
        share = float(x.mean())
        return {"rate": round(share, 4), "se": round(math.sqrt(share * (1 - share) / len(x)), 4)}

    return {
        "runs": runs, "users_per_arm": users, "looks": looks, "alpha": alpha,
        "aa_fpr_fixed": rate(aa[:, 0]), "aa_fpr_fixed_peeking": rate(aa[:, 1]), "aa_fpr_sequential": rate(aa[:, 2]),
        "lift": lift, "power_fixed": rate(ab[:, 0]), "power_sequential": rate(ab[:, 3]),
        "world": {"impressions_per_user": 1 + impressions, "ctr": ctr, "beta_concentration": concentration},
        "seconds": round(time.perf_counter() - t0, 1),
    }
