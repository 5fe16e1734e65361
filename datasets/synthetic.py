"""A deterministic synthetic behaviour log with the structure DIN is built to exploit.

* Users hold latent interests over categories (a sparse Dirichlet draw) that *drift*: at each
  event, with probability ``drift``, a fresh interest vector is mixed in.
* Items belong to one category; within a category, popularity is Zipf(``zipf_s``), so a few
  items take most clicks and a long tail takes the rest.
* A fraction ``new_item_frac`` of items arrive during the log, not before it; an item is never
  clicked before it arrives.

Same seed, same arguments → byte-identical output.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dinrec.datasets.base import Interactions

T0 = 1_700_000_000.0  # 2023-11-14, an arbitrary fixed origin


@dataclass(frozen=True)
class SyntheticConfig:
    n_users: int = 2000
    n_items: int = 3000
    n_categories: int = 40
    mean_events_per_user: int = 40
    min_events_per_user: int = 5
    days: float = 60.0
    drift: float = 0.05
    interest_alpha: float = 0.15
    zipf_s: float = 1.1
    new_item_frac: float = 0.2
    seed: int = 0


@dataclass(frozen=True)
class World:
    """The ground truth behind a synthetic log (what a simulated user's clicks are drawn from):
    item index → category index and within-category popularity weight (1 / rank^s), and each
    user's category interests as they stand at the end of the log (rows sum to 1)."""

    item_category: np.ndarray  # (n_items,) int
    item_weight: np.ndarray    # (n_items,) float
    interest: np.ndarray       # (n_users, n_categories) float


def generate(cfg: SyntheticConfig = SyntheticConfig()) -> Interactions:
    return generate_world(cfg)[0]


def generate_world(cfg: SyntheticConfig = SyntheticConfig()) -> tuple[Interactions, World]:
    """The log and the world it was drawn from (same seed, same log as :func:`generate`)."""
    rng = np.random.default_rng(cfg.seed)
    span = cfg.days * 86_400.0
    item_cat = rng.integers(0, cfg.n_categories, size=cfg.n_items)
    arrival = np.where(rng.random(cfg.n_items) < cfg.new_item_frac, T0 + rng.random(cfg.n_items) * span, T0)

    # Per category: items ordered by arrival, so "available at t" is a prefix; cumulative Zipf
    # weights over that order let one searchsorted draw an available item.
    by_cat, cum_w, arrivals = [], [], []
    item_weight = np.zeros(cfg.n_items)
    final_interest = np.zeros((cfg.n_users, cfg.n_categories))
    for c in range(cfg.n_categories):
        members = np.flatnonzero(item_cat == c)
        members = members[np.argsort(arrival[members], kind="stable")]
        ranks = rng.permutation(len(members)) + 1  # popularity rank independent of arrival
        item_weight[members] = 1.0 / ranks.astype(np.float64) ** cfg.zipf_s
        by_cat.append(members)
        cum_w.append(np.cumsum(1.0 / ranks.astype(np.float64) ** cfg.zipf_s))
        arrivals.append(arrival[members])

    users, items, times = [], [], []
    n_events = np.maximum(rng.geometric(1.0 / cfg.mean_events_per_user, size=cfg.n_users),
                          cfg.min_events_per_user)
    for u in range(cfg.n_users):
        n = int(n_events[u])
        ts = np.sort(T0 + rng.random(n) * span)
        interest = np.cumsum(rng.dirichlet(np.full(cfg.n_categories, cfg.interest_alpha)))
        drift_at = rng.random(n) < cfg.drift
        for t, d in zip(ts, drift_at, strict=True):
            if d:
                fresh = np.cumsum(rng.dirichlet(np.full(cfg.n_categories, cfg.interest_alpha)))
                interest = 0.5 * interest + 0.5 * fresh  # still a CDF: a mix of two CDFs
            c = min(int(np.searchsorted(interest, rng.random() * interest[-1], side="right")),
                    cfg.n_categories - 1)
            k = int(np.searchsorted(arrivals[c], t, side="right"))  # items arrived by t
            if k == 0:
                continue
            j = int(np.searchsorted(cum_w[c][:k], rng.random() * cum_w[c][k - 1], side="right"))
            users.append(u)
            items.append(int(by_cat[c][min(j, k - 1)]))
            times.append(round(float(t), 3))
        final_interest[u] = np.diff(interest, prepend=0.0) / interest[-1]  # the CDF back to weights

    items_arr = np.asarray(items)
    data = Interactions.from_columns(
        np.char.add("u", np.asarray(users).astype(str)),
        np.char.add("i", items_arr.astype(str)),
        np.char.add("c", item_cat[items_arr].astype(str)),
        np.asarray(times), event_type="click", source=f"synthetic-seed{cfg.seed}",
    )
    return data, World(item_cat, item_weight, final_interest)
