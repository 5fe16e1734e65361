"""Simulated users for rehearsing an experiment before real users see it.

The users come from a synthetic world (datasets.synthetic.World): each has known
category interests. They ask a running service for recommendations over HTTP and click each shown
item with probability ``position_bias(p) · (base + gain · interest[user, category(item)])``, where
``position_bias(p) = 1 / log2(p + 2)`` (the top slot is seen most), buy what they clicked with probability
``buy_base + buy_gain · interest`` (at the item's price), then send the clicks and buys back through
``POST /events`` — clicks with the answer's request id, buys as plain events attributed by exposure —
exactly what a client integration does. An arm may also change how its users respond beyond the list
(:class:`Response`: a presentation change the service does not see, such as thumbnails that tempt clicks).
The truth is known, so the experiment's verdict can be checked against it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dinrec.datasets.synthetic import World
from dinrec.experiments.state import ExperimentState


@dataclass(frozen=True)
class ClickModel:
    base: float = 0.01   # clicks on things the user has no interest in
    gain: float = 0.6    # how much interest in the item's category adds
    buy_base: float = 0.05  # P(buy | click) of an item the user has no interest in
    buy_gain: float = 0.5   # how much interest adds to it

    def probability(self, interest: float, position: int) -> float:
        return min(1.0, (self.base + self.gain * interest) / math.log2(position + 2))

    def buy_probability(self, interest: float) -> float:
        return min(1.0, self.buy_base + self.buy_gain * interest)


@dataclass(frozen=True)
class Response:
    """How one arm's users respond beyond what its list holds — a presentation change the service does not
    see (thumbnails that tempt clicks, a checkout that loses buyers): P(click) and P(buy | click) scaled."""

    click: float = 1.0
    buy: float = 1.0


def price(item_index: int) -> float:
    """An item's price in the simulated shop (fixed per item: 5 … 99)."""
    return 5.0 + (item_index * 37) % 95


def simulate(client, world: World, *, users: int, rounds: int, k: int = 10, seed: int = 0,
             clicks: ClickModel = ClickModel(), responses: dict[str, Response] | None = None,
             before_clicks: Callable[[dict], None] | None = None) -> dict:
    """``rounds`` requests per user (users u0 … u{users−1}, shuffled each round) against ``client``
    (an httpx client with the service's base URL); returns what was served, clicked and bought (and its
    value), per variant. ``responses``: by variant, how its users respond beyond the list.

    ``before_clicks(served_so_far)`` runs before each batch of clicks is sent: a person clicks seconds
    after the list is shown, these users within a millisecond, before the service has logged the
    list's impressions off the request path — and a click whose impression is not logged yet is
    rightly counted apart (an orphan). Pass :func:`wait_until_logged` to click as people do."""
    rng = np.random.default_rng(seed)
    served: dict[str, dict[str, float]] = {}  # counts, and "value" summed prices
    for _ in range(rounds):
        batch = []
        for u in rng.permutation(users):
            r = client.get("/recommend", params={"user_id": f"u{u}", "k": k})
            r.raise_for_status()
            body = r.json()
            variant = body.get("variant") or "(none)"
            tally = served.setdefault(variant, {"requests": 0, "shown": 0, "clicked": 0, "bought": 0, "value": 0.0})
            response = (responses or {}).get(variant, Response())
            tally["requests"] += 1
            for pos, item in enumerate(body["items"]):
                tally["shown"] += 1
                idx = int(item["item_id"].removeprefix("i"))
                interest = float(world.interest[u, world.item_category[idx]])
                if rng.random() < min(1.0, response.click * clicks.probability(interest, pos)):
                    tally["clicked"] += 1
                    common = {"user_id": f"u{u}", "item_id": item["item_id"], "category_id": item["category_id"],
                              "ts": time.time()}
                    batch.append({"event_id": f"sim-{body['request_id']}-{pos}", "event_type": "click",
                                  "request_id": body["request_id"], **common})
                    if rng.random() < min(1.0, response.buy * clicks.buy_probability(interest)):
                        tally["bought"] += 1
                        tally["value"] += price(idx)
                        batch.append({"event_id": f"sim-buy-{body['request_id']}-{pos}", "event_type": "buy",
                                      "value": price(idx), **common})
            if len(batch) >= 200:
                _send(client, batch, served, before_clicks)
                batch = []
        if batch:
            _send(client, batch, served, before_clicks)
    return served


def _send(client, batch: list[dict], served: dict, before_clicks: Callable[[dict], None] | None) -> None:
    if before_clicks is not None:
        before_clicks(served)
    client.post("/events", json={"events": batch}).raise_for_status()


def wait_until_logged(state: ExperimentState, experiment: str, served: dict, timeout_s: float = 60.0) -> None:
    """Wait until ``state`` counts, for ``experiment``, every impression :func:`simulate` reported
    showing inside it: impressions are logged off the request path, so they trail the answers."""
    shown = sum(v["shown"] for name, v in served.items() if name != "(none)")
    deadline = time.monotonic() + timeout_s
    while sum(s.impressions for s in state.sums(experiment).values()) < shown:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{experiment}: impressions were not all logged within {timeout_s:.0f}s")
        time.sleep(0.05)
