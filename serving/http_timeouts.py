"""A read timeout for uvicorn's HTTP protocol: a request must arrive whole within a bound.

uvicorn closes idle keep-alive connections (``timeout_keep_alive``) but sets no limit on how long a
request may take to arrive: a client trickling its headers a byte at a time (slowloris), or sending a
Content-Length and never the body, holds a connection and a slot of the in-flight cap for as long as
it likes. This protocol starts a timer when a connection opens and when a request's first byte
arrives, and stops it once the request is complete; if it fires, the connection is closed (a body
being awaited reads as a disconnect). The timeout comes from the lifespan's state
(``DINREC_REQUEST_READ_TIMEOUT_S``), so it is validated with the other settings at start-up.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from dinrec.serving.settings import ServingSettings

READ_TIMEOUT_KEY = "dinrec.request_read_timeout_s"
# for an app whose lifespan did not say (dinrec's always does): the setting's own default
DEFAULT_READ_TIMEOUT_S: float = ServingSettings.model_fields["request_read_timeout_s"].default

# what `uvicorn.run(http=...)` takes, also in the workers it spawns
PROTOCOL = "dinrec.serving.http_timeouts:ReadTimeoutHttpToolsProtocol"


class ReadTimeoutHttpToolsProtocol(HttpToolsProtocol):
    _read_timer: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        self._disarm()
        timeout = self.app_state.get(READ_TIMEOUT_KEY, DEFAULT_READ_TIMEOUT_S)
        self._read_timer = self.loop.call_later(timeout, self._read_timed_out)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _read_timed_out(self) -> None:
        self._read_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm()  # a connection that sends nothing is dropped too

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)
