"""What "a dependency is down" looks like, for every layer: one marker class, and the test that finds an
outage anywhere in an error's causes (a registry or checkpoint error raised *from* an unreachable S3 is
still an outage). The command line turns it into exit 75 (EX_TEMPFAIL: retry later), apart from a
usage or configuration error (2), so a scheduler can tell a typo from something worth retrying."""

from __future__ import annotations

from dinrec.storage.aws import CloudError


class DependencyUnavailable(Exception):
    """A service dinrec depends on (the online store, the event stream, object storage) could not be
    reached or failed to answer: the same call may succeed later."""


class MissingDependency(ImportError):
    """An optional backend's client library is not installed (redis, confluent-kafka): not an outage but a
    configuration error (exit 2), raised where the backend is chosen."""


def outage(exc: BaseException) -> BaseException | None:
    """The first outage among ``exc`` and its causes (``raise … from``, or raised while handling), else None."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DependencyUnavailable) or (isinstance(current, CloudError) and current.transient):
            return current
        current = current.__cause__ or current.__context__
    return None
