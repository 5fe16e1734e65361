"""Per-user event quotas: what one user id may send through ``POST /events``, per worker process.

A token bucket per user (``DINREC_EVENTS_PER_USER_PER_MINUTE``, refilled continuously, holding at most a
minute's worth): a person's clicks and views never come near it, a client replaying thousands of events
for one id is answered 429 with the seconds until its batch would fit. A request is accepted whole or
refused whole. A bucket idle for a minute is full again and forgotten, and beyond ``max_users`` the least
recently seen go (a user forgotten starts full again), so ids a client invents cannot grow the worker's
memory. Each worker
counts its own: behind N workers a user may send up to N quotas. The operator (the admin token) is
not counted: backfills and the benches replay whole histories.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping


class UserQuota:
    def __init__(self, per_minute: int, max_users: int = 100_000, clock: Callable[[], float] = time.monotonic) -> None:
        if per_minute < 1 or max_users < 1:
            raise ValueError("per_minute and max_users must be >= 1")
        self.rate, self.burst, self.max_users, self._clock = per_minute / 60.0, float(per_minute), max_users, clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # user -> (tokens, at), LRU first
        self._lock = threading.Lock()  # /events runs in the threadpool

    def take(self, events_by_user: Mapping[str, int]) -> float:
        """Spend the events of every user, or none: 0.0 when taken, else the seconds until every user's
        bucket holds its events (never, for a batch over the bucket: ``inf``)."""
        now = self._clock()
        with self._lock:
            left = {}
            wait = 0.0
            for user, n in events_by_user.items():
                tokens, at = self._buckets.get(user, (self.burst, now))
                tokens = min(self.burst, tokens + (now - at) * self.rate)
                left[user] = tokens - n
                if n > tokens:
                    wait = max(wait, math.inf if n > self.burst else (n - tokens) / self.rate)
            if wait:
                return wait
            for user, tokens in left.items():
                self._buckets[user] = (tokens, now)
                self._buckets.move_to_end(user)
            # A bucket untouched for the time it takes to refill is full: forgetting it changes nothing, so the
            # worker holds the users of the last minute (at most max_users of them: then the least recent go).
            while self._buckets and (len(self._buckets) > self.max_users
                                     or next(iter(self._buckets.values()))[1] <= now - self.burst / self.rate):
                self._buckets.popitem(last=False)
            return 0.0

    def __len__(self) -> int:
        return len(self._buckets)
