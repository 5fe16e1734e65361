"""The event streams' errors. Backends (kafka) map their client's errors into these once, at the adapter
boundary, so callers never catch a third-party exception type."""

from dinrec.storage.outage import DependencyUnavailable


class StreamError(Exception):
    """Base class for the streams' errors."""


class StreamUnavailable(StreamError, DependencyUnavailable):
    """The event stream (broker) could not be reached or answered with an error."""
