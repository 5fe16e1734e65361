"""IMDSv2 on the spot instance: the interruption notice and the rebalance recommendation.

IMDSv2 needs a session token (``PUT /latest/api/token``) sent with every read; a 401 means the
token expired, so we fetch a new one once and retry. A 404 on ``spot/instance-action`` means "no
interruption scheduled" — the normal case. Tested against AWS's amazon-ec2-metadata-mock.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from dinrec.storage.loops import every

log = logging.getLogger(__name__)

DEFAULT_IMDS = "http://169.254.169.254"
TOKEN_TTL_S = 21600


class ImdsError(RuntimeError):
    """The metadata service is unreachable or answered something unexpected."""


@dataclass(frozen=True)
class InterruptionNotice:
    action: str  # terminate | stop | hibernate
    time: str  # when it happens (RFC 3339), about 2 minutes after the notice


class Imds:
    def __init__(self, base_url: str = DEFAULT_IMDS, timeout_s: float = 2.0) -> None:
        self.base_url, self.timeout_s = base_url.rstrip("/"), timeout_s
        self._token: str | None = None

    def _fetch_token(self) -> str:
        req = urllib.request.Request(f"{self.base_url}/latest/api/token", method="PUT",
                                     headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return resp.read().decode()
        except (urllib.error.URLError, OSError) as exc:
            raise ImdsError(f"IMDSv2 token request to {self.base_url} failed: {exc}") from exc

    def get(self, path: str) -> str | None:
        """The text at ``/latest/meta-data/{path}``, or None where there is none (404)."""
        for attempt in (1, 2):
            if self._token is None:
                self._token = self._fetch_token()
            req = urllib.request.Request(f"{self.base_url}/latest/meta-data/{path}",
                                         headers={"X-aws-ec2-metadata-token": self._token})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    return resp.read().decode()
            except urllib.error.HTTPError as exc:
                exc.close()  # the error carries the open response
                if exc.code == 404:
                    return None
                if exc.code == 401 and attempt == 1:  # token expired: one fresh token, one retry
                    self._token = None
                    continue
                raise ImdsError(f"IMDS {path}: HTTP {exc.code}") from exc
            except (urllib.error.URLError, OSError) as exc:
                raise ImdsError(f"IMDS {path}: {exc}") from exc
        raise AssertionError("unreachable")

    def interruption(self) -> InterruptionNotice | None:
        text = self.get("spot/instance-action")
        if text is None:
            return None
        try:
            doc = json.loads(text)
            return InterruptionNotice(action=str(doc["action"]), time=str(doc["time"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise ImdsError(f"unexpected spot/instance-action document: {text[:200]!r}") from exc

    def rebalance_recommended(self) -> bool:
        return self.get("events/recommendations/rebalance") is not None

    def instance_id(self) -> str | None:
        return self.get("instance-id")


class InterruptionWatcher:
    """Polls every ``poll_s`` (5 s: the notice gives 2 minutes) on a daemon thread and calls
    ``on_rebalance`` once at the first rebalance recommendation and ``on_interruption`` once at
    the first interruption notice. IMDS errors are logged and polling goes on."""

    def __init__(self, imds: Imds, *, on_interruption: Callable[[InterruptionNotice], None],
                 on_rebalance: Callable[[], None] | None = None, poll_s: float = 5.0) -> None:
        self.imds, self.poll_s = imds, poll_s
        self.on_interruption, self.on_rebalance = on_interruption, on_rebalance
        self.notice: InterruptionNotice | None = None
        self.rebalanced = False
        self.errors = 0  # polls that failed (logged; polling goes on)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> InterruptionWatcher:
        self._thread = every(self.poll_s, self._stop, self._poll, name="spot-watcher", first_now=True)
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.poll_s + 5)

    def poll_once(self) -> None:
        if self.on_rebalance is not None and not self.rebalanced and self.imds.rebalance_recommended():
            self.rebalanced = True
            log.warning("spot rebalance recommendation: checkpointing early")
            self.on_rebalance()
        if self.notice is None:
            notice = self.imds.interruption()
            if notice is not None:
                self.notice = notice
                log.warning("spot interruption notice: %s at %s", notice.action, notice.time)
                self.on_interruption(notice)

    def _poll(self) -> None:
        """One round of the watcher's loop (storage.loops.every: anything else that raises — a callback,
        say — is logged there and the next round runs); the notice ends the loop."""
        try:
            self.poll_once()
        except ImdsError as exc:
            self.errors += 1
            log.warning("%s", exc)
        finally:
            if self.notice is not None:
                self._stop.set()
