"""New items, recallable before the next retraining: the store's catalog (every item in the order it
was first seen in a behaviour) is polled every ``DINREC_CATALOG_POLL_S``; items the serving model
does not know join its cold lane (serving.ranking.ColdLane: recalled through their category's
vector, scored by DIN as an unknown item of that category). A model that loads later gets the
same list, and keeps only what it does not know itself.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from feature_store.online import OnlineStore
from serving.loops import every

log = logging.getLogger(__name__)


class Catalog:
    def __init__(self, known: Callable[[str], bool], apply: Callable[[list[tuple[str, str]]], None]) -> None:
        """``known(item)``: whether the serving model knows it; ``apply(items)``: give the models the
        current list of (item, category) they may not know."""
        self.known, self.apply = known, apply
        self.cursor = 0
        self.items: list[tuple[str, str]] = []  # replaced whole: read by model swaps

    def poll(self, store: OnlineStore) -> int:
        """Read what ``store``'s catalog gained since the last poll; returns how many new items it had."""
        new: list[tuple[str, str]] = []
        while True:
            page, cursor = store.catalog(self.cursor)
            if not page:
                break
            new += [(item, cat) for item, cat in page if not self.known(item)]
            self.cursor = cursor
        if new:
            self.items = self.items + new
            self.apply(self.items)
            log.info("catalog: %d items the model does not know are recallable by category", len(self.items))
        return len(new)

    def run(self, store: OnlineStore, stop: threading.Event, interval_s: float) -> threading.Thread:
        """Poll at once, then every ``interval_s`` until ``stop``."""
        return every(interval_s, stop, lambda: self.poll(store), name="dinrec-catalog", first_now=True)
