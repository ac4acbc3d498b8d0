"""Connections that never finish a request are closed: uvicorn's HTTP/1.1 protocol (h11) with
a deadline on receiving each request.

uvicorn times out a keep-alive connection idle *between* requests (``timeout_keep_alive``), but
not one that was opened and sent nothing, nor one that sent part of a request (a header
line, a body shorter than its ``Content-Length``) and then fell silent: a half-open
connection, or a slow-loris client, holds its socket and its slot for ever. Here each
request must arrive whole (request line, headers and body) within ``request_timeout_s`` of
the connection opening, or of its first byte after the previous answer; past that the
connection is closed. A request whose body was still being read sees a disconnect
(``rlpulse.trainer.serve.app`` does not count it as answered). Time spent generating an answer is
not limited: the deadline ends once the request is in.

>>> protocol = RequestDeadlineProtocol.with_timeout(5.0)
>>> protocol.request_timeout_s, issubclass(protocol, RequestDeadlineProtocol)
(5.0, True)
>>> # uvicorn.run(app, http=protocol, ...)
"""

from __future__ import annotations

import asyncio
import logging
from typing import ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("rlpulse.serve")

_RECEIVING = (h11.IDLE, h11.SEND_BODY)
"""The client's states while a request is (possibly) on its way: nothing or part of its head
(IDLE), or its body (SEND_BODY)."""


class RequestDeadlineProtocol(H11Protocol):
    """h11's protocol with a deadline on receiving each request (see the module docstring).
    Made for one timeout by :meth:`with_timeout`; uvicorn instantiates it per connection."""

    request_timeout_s: ClassVar[float] = 30.0
    _deadline: asyncio.TimerHandle | None = None

    @classmethod
    def with_timeout(cls, seconds: float) -> type[RequestDeadlineProtocol]:
        """This protocol with a deadline of ``seconds`` (a positive number)."""
        if not seconds > 0:
            raise ValueError(f"request timeout must be positive, got {seconds!r}")
        return type(cls.__name__, (cls,), {"request_timeout_s": float(seconds)})

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()  # a connection that sends nothing is timed out too

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # Idle until the next request: uvicorn's keep-alive timeout governs; a pipelined
        # request already in the buffer starts its own deadline.
        self._disarm()
        if self.conn.their_state is h11.SEND_BODY or (
            self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]
        ):
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _follow(self) -> None:
        """After new bytes: keep the deadline while the request is incomplete, end it once
        the request is in (or the connection is done with)."""
        if self.conn.their_state in _RECEIVING and not self.transport.is_closing():
            if self._deadline is None:
                self._arm()
        else:
            self._disarm()

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.request_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        client = "{}:{}".format(*self.client) if self.client else "?"
        log.info(
            "serve: closed the connection of %s: no complete request in %gs",
            client,
            self.request_timeout_s,
        )
        self.transport.close()
