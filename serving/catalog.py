"""New items, recallable before the next retraining: the store's catalog (every item in the order it
was first seen in a behaviour) is polled every ``DINREC_CATALOG_POLL_S``; items the serving model
does not know join its cold lane (models.ranking.ColdLane: recalled through their category's
vector, scored by DIN as an unknown item of that category). A model that loads later gets the
same list, and keeps only what it does not know itself.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from dinrec.feature_store.online import OnlineStore
from dinrec.feature_store.online.base import CatalogCursor
from dinrec.storage.loops import every

if TYPE_CHECKING:
    from dinrec.serving.models import ModelManager

log = logging.getLogger(__name__)


class Catalog:
    def __init__(self, known: Callable[[str], bool] | None = None,
                 apply: Callable[[list[tuple[str, str]]], object] | None = None, per_category: int = 1000) -> None:
        """``known(item)``: whether the serving model knows it; ``apply(items)``: give the models the
        current list of (item, category) they may not know (or :meth:`attach` a ModelManager);
        ``per_category``: the newest this many of a category are kept (what the models hold is bounded by
        the categories they know, whatever the catalog gains)."""
        if per_category < 1:
            raise ValueError("per_category must be >= 1")
        self.per_category = per_category
        self.known, self.apply = known or (lambda item: False), apply or (lambda items: None)
        self.cursor: CatalogCursor = ()
        self.items: list[tuple[str, str]] = []  # replaced whole: read by model swaps
        self._listed: set[str] = set()  # a sharded store may list an item once per shard: the first counts
        self.polls = 0  # finished polls: what shows the loop is reading

    def attach(self, models: ModelManager) -> None:
        """Check items against the model serving now, and give the list to every model serving."""
        self.known = lambda item: models.current is not None and models.current.knows(item)
        self.apply = lambda items: [rec.set_cold_items(items) for rec in models.serving()]

    def poll(self, store: OnlineStore) -> int:
        """Read what ``store``'s catalog gained since the last poll; returns how many new items it had."""
        new: list[tuple[str, str]] = []
        while True:
            page, cursor = store.catalog(self.cursor)
            if not page:
                break
            for item, cat in page:
                if item not in self._listed:
                    self._listed.add(item)
                    if not self.known(item):
                        new.append((item, cat))
            self.cursor = cursor
        if new:
            self.items = self._newest(self.items + new)
            self.apply(self.items)
            log.info("catalog: %d items the model does not know are recallable by category", len(self.items))
        self.polls += 1
        return len(new)

    def _newest(self, items: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """``items`` (in the order listed) less all but the newest ``per_category`` of each category."""
        per_cat = Counter(cat for _, cat in items)
        over = {cat: n - self.per_category for cat, n in per_cat.items() if n > self.per_category}
        if not over:
            return items
        kept = []
        for item, cat in items:
            if over.get(cat, 0) > 0:
                over[cat] -= 1  # one of the oldest of its category: dropped
            else:
                kept.append((item, cat))
        return kept

    def run(self, store: OnlineStore, stop: threading.Event, interval_s: float) -> threading.Thread:
        """Poll at once, then every ``interval_s`` until ``stop``."""
        return every(interval_s, stop, lambda: self.poll(store), name="dinrec-catalog", first_now=True)
