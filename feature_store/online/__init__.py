"""Online stores: a user's recent behaviours and item popularity, read on every request."""

from feature_store.online.base import OnlineStore, open_store

__all__ = ["OnlineStore", "open_store"]
