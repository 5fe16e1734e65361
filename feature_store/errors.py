"""The project's own exceptions for feature_store.

Backends (redis, kafka) map their client's errors into these once, at the adapter boundary, so
callers never catch a third-party exception type.
"""


class FeatureStoreError(Exception):
    """Base class for feature_store errors."""


class InvalidEvent(FeatureStoreError, ValueError):
    """An event failed validation (bad JSON, a missing field, a value out of range)."""


class StoreUnavailable(FeatureStoreError):
    """The online store could not be reached or answered with an error."""


class StreamUnavailable(FeatureStoreError):
    """The event stream (broker) could not be reached or answered with an error."""


class DatasetError(FeatureStoreError, ValueError):
    """A dataset folder or file is not in a layout dinrec recognises, or is malformed."""


class MissingDependency(FeatureStoreError, ImportError):
    """An optional backend's client library is not installed."""
