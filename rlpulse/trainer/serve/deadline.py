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

At most ``max_connections`` connections are open at once: one beyond is answered 503
``overloaded`` at once and closed (uvicorn has no cap by default: a flood of half-open
connections each held a socket and its buffers until its deadline), counted by the server as
an answer with error ``overloaded`` (``on_refused``: in ``/healthz`` and the serve metrics),
and logged, at most once every ``REFUSED_LOG_S`` with the count since.

>>> protocol = RequestDeadlineProtocol.with_timeout(5.0, 64)
>>> protocol.request_timeout_s, protocol.max_connections
(5.0, 64)
>>> # uvicorn.run(app, http=protocol, ...)
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from rlpulse.schemas import serving as S

log = logging.getLogger("rlpulse.serve")

REFUSED_LOG_S = 10.0
"""Connections refused over ``max_connections`` are logged at most this often."""
_REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s"
)
_RECEIVING = (h11.IDLE, h11.SEND_BODY)
"""The client's states while a request is (possibly) on its way: nothing or part of its head
(IDLE), or its body (SEND_BODY)."""


class RequestDeadlineProtocol(H11Protocol):
    """h11's protocol with a deadline on receiving each request (see the module docstring).
    Made for one timeout by :meth:`with_timeout`; uvicorn instantiates it per connection."""

    request_timeout_s: ClassVar[float] = 30.0
    max_connections: ClassVar[int] = 256
    _deadline: asyncio.TimerHandle | None = None
    on_refused: ClassVar[tuple[Callable[[], None], ...]] = ()
    """Called for each connection refused (the server counts it); a tuple, so that reading it
    through ``self`` does not bind it as a method."""
    _refused: ClassVar[list[float]] = [0, -REFUSED_LOG_S]
    """Connections refused since the last log line, and when that was (one server a process)."""

    @classmethod
    def with_timeout(
        cls,
        seconds: float,
        max_connections: int = 256,
        on_refused: Callable[[], None] | None = None,
    ) -> type[RequestDeadlineProtocol]:
        """This protocol with a deadline of ``seconds`` (a positive number), at most
        ``max_connections`` open at once, and ``on_refused`` called per connection refused."""
        if not seconds > 0:
            raise ValueError(f"request timeout must be positive, got {seconds!r}")
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {max_connections!r}")
        attrs = {
            "request_timeout_s": float(seconds),
            "max_connections": int(max_connections),
            "on_refused": (on_refused,) if on_refused is not None else (),
        }
        return type(cls.__name__, (cls,), attrs)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            self._refuse()
            return
        self._arm()  # a connection that sends nothing is timed out too

    def _refuse(self) -> None:
        """Over ``max_connections``: answer 503 ``overloaded`` and close, before reading."""
        body = json.dumps(
            {
                "error": S.OVERLOADED,
                "field": None,
                "message": f"more than {self.max_connections} connections open; retry later",
            }
        ).encode()
        self.transport.write(_REFUSED % (len(body), body))
        self.transport.close()
        for hook in self.on_refused:
            hook()
        refused = self._refused
        refused[0] += 1
        now = self.loop.time()
        if now - refused[1] >= REFUSED_LOG_S:
            log.warning(
                "serve: refused %d connections over max_connections (%d) in the last %gs",
                refused[0],
                self.max_connections,
                min(now - refused[1], 1e9),
            )
            refused[0], refused[1] = 0, now

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
