"""The online store's errors (the event, dataset and stream errors are in their own rooms).

Backends (redis) map their client's errors into these once, at the adapter boundary, so
callers never catch a third-party exception type.
"""

from dinrec.storage.outage import DependencyUnavailable


class FeatureStoreError(Exception):
    """Base class for feature_store errors."""


class StoreUnavailable(FeatureStoreError, DependencyUnavailable):
    """The online store could not be reached or answered with an error."""


class OffsetConflict(FeatureStoreError):
    """A stream write expected offsets the store does not hold (another consumer applied them, or
    the store lost recent writes); nothing was written. ``stored`` is what the store holds for
    the conflicting partitions (-1: nothing), where the consumer must resume from."""

    def __init__(self, topic: str, stored: dict[int, int]) -> None:
        super().__init__(f"offsets of {topic!r} differ from the store's: {stored}")
        self.topic = topic
        self.stored = stored


class StoreLayoutError(FeatureStoreError, ValueError):
    """The store's data is in another layout than this version reads (an older key layout, or
    another partition count): a configuration error, refused rather than read or written wrongly."""


class StoreConfigError(FeatureStoreError, ValueError):
    """The store is set up in a way that would lose data dinrec keeps there (a Redis that may evict keys):
    refused at start-up rather than found out later."""
