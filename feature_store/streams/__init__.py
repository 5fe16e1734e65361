"""Event streams: where behaviour events travel from producers (the API) to ingestion."""

from feature_store.streams.base import Consumer, EventStream, Record, open_stream

__all__ = ["Consumer", "EventStream", "Record", "open_stream"]
