"""Index ↔ external id maps shared by training samples and the bundle (serving reads them)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PAD = 0  # index 0 is padding / unknown in every vocabulary


@dataclass(frozen=True)
class Vocab:
    """index → external id (index 0 is "<pad>"), and each item's category index."""

    items: list[str]
    categories: list[str]
    item_category: np.ndarray  # (n_items,) int64, item index → category index

    @property
    def n_items(self) -> int:
        return len(self.items)

    @property
    def n_categories(self) -> int:
        return len(self.categories)

    def item_index(self) -> dict[str, int]:
        return {item: i for i, item in enumerate(self.items) if i != PAD}

    def to_json(self) -> dict:
        return {"items": self.items, "categories": self.categories,
                "item_category": self.item_category.tolist()}

    @classmethod
    def from_json(cls, d: dict) -> Vocab:
        return cls(list(d["items"]), list(d["categories"]), np.asarray(d["item_category"], dtype=np.int64))
