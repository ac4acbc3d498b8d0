"""The collector's side of the wire: the ROUTER socket (bound, optionally CurveZMQ), and the
receiver that turns its frames into validated messages and sends acknowledgements back.

:func:`open_socket` builds the socket from the config; :class:`Receiver` takes any socket
with ZeroMQ's ``recv``/``send`` (tests pass their own). Rejects are counted
by reason and logged with rate limiting; a failed CurveZMQ handshake is counted too. A
rejected data message whose producer and number are still readable goes on as a
:class:`~rlpulse.schemas.protocol.Rejected` stand-in, so its producer's later messages are not held up
behind it; a hello's bad tables are counted and left out, its good ones kept.

Memory is bounded where the bytes arrive. ZeroMQ reads a connection ahead of the collector
into its own queue, so the collector's bound on what it keeps for producers not registered
yet (``rlpulse.collector.intake.delivery``) came too late: 150 messages of 7.7 MB from producers
that never registered took a collector from 48 to 752 MB, kept. Now a message is refused by
ZeroMQ above the largest a producer sends (``MAXMSGSIZE``); each connection's queue holds at
most ``RCVHWM`` messages before ZeroMQ stops reading it (the sender waits); a large data
message is screened by its producer before it is copied or decoded (``SCREEN_BYTES``), so one
the collector would not keep goes as fast as it comes; and the daemon process returns freed
large buffers to the system (:func:`return_large_buffers`).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.health import Health
from rlpulse.collector.ratelog import RateLimitedLog
from rlpulse.schemas import protocol
from rlpulse.schemas.errors import ConfigError, SchemaError

log = logging.getLogger("rlpulse.collector")
RCVHWM = 1_000
"""Messages ZeroMQ queues per connection before it stops reading it (the sender then waits or
counts): ZeroMQ's default. Producers have at most this many in flight unacknowledged only
while the collector is not reading (a full disk), and they keep and resend those."""
MAXMSGSIZE_MARGIN = 64 * 1024
"""ZeroMQ's hard cap is the decoder's limit (at least ``DEFAULT_LIMITS.max_bytes``) plus this."""
SCREEN_BYTES = 64 * 1024
"""Data messages at least this large are screened by producer before they are decoded
(``Delivery.screen``); smaller ones cost less to decode than to screen."""
MMAP_THRESHOLD = 1 << 20
"""Allocations of at least this many bytes get pages of their own, given back when freed
(:func:`return_large_buffers`)."""
_M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameter number (malloc.h)."""
_NOBLOCK = int(zmq.NOBLOCK)
_MORE = int(zmq.SNDMORE | zmq.NOBLOCK)
"""The identity frame of an acknowledgement (a ROUTER without ROUTER_MANDATORY drops a
message to a peer it does not know, whole: it never refuses the frames after the first)."""
_HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)


class Endpoint:
    """The bound socket and what comes with it: the ZAP authenticator and the monitor of
    failed handshakes (with CurveZMQ). ``close()`` undoes it all, safe to call twice."""

    def __init__(self, config: CollectorConfig, context: zmq.Context) -> None:
        self.context = context
        self.auth: ThreadAuthenticator | None = None
        self.monitor: zmq.Socket | None = None
        self.socket = context.socket(zmq.ROUTER)
        try:
            self.socket.setsockopt(zmq.LINGER, 0)
            self.socket.setsockopt(zmq.RCVHWM, RCVHWM)
            # Hard cap in libzmq (the peer is disconnected); the decoder's softer limit is counted.
            # It stays above what a producer sends at most (``protocol.MAX_PAYLOAD_BYTES``), so
            # a collector configured below that rejects such a message (and the producer hears
            # of it), instead of cutting the connection on every resend.
            self.socket.setsockopt(zmq.MAXMSGSIZE, max_message_size(config))
            if config.curve is not None:
                self._secure(config.curve)
            try:
                self.socket.bind(config.bind)
            except zmq.ZMQError as exc:  # in use, not an address of this machine, bad transport
                raise ConfigError(
                    "bind", f"cannot listen there: {exc.strerror}", config.bind
                ) from None
        except BaseException:
            self.close()
            raise
        self.address: str = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)

    def _secure(self, curve: Mapping[str, str]) -> None:
        """CurveZMQ: encrypt, and admit only clients whose public key is in ``clients_dir``."""
        clients = Path(curve["clients_dir"])
        secrets = sorted(p.name for p in clients.glob("*.key_secret"))
        if secrets:
            log.warning(
                "curve.clients_dir %s holds secret keys (%s): it needs only the workers' public "
                "*.key files; keep secret keys on the workers",
                clients,
                ", ".join(secrets),
            )
        if not any(clients.glob("*.key")):
            log.warning(
                "curve.clients_dir %s holds no public key (*.key): every client is refused", clients
            )
        public, secret = zmq.auth.load_certificate(str(curve["server_cert"]))
        if secret is None:
            raise ConfigError(
                "curve.server_cert",
                "holds no secret key: use the *.key_secret file",
                curve["server_cert"],
            )
        self.auth = ThreadAuthenticator(self.context)
        self.auth.start()
        self.auth.configure_curve(domain="*", location=str(clients))
        self.socket.curve_secretkey = secret
        self.socket.curve_publickey = public
        self.socket.curve_server = True
        self.monitor = self.socket.get_monitor_socket(_HANDSHAKE_FAILED)

    def close(self) -> None:
        if self.monitor is not None:
            self.socket.disable_monitor()
            self.monitor.close(linger=0)
            self.monitor = None
        if not self.socket.closed:
            self.socket.close()
        if self.auth is not None:
            self.auth.stop()
            self.auth = None


def max_message_size(config: CollectorConfig) -> int:
    """ZeroMQ's cap on one message (``ZMQ_MAXMSGSIZE``): a larger one cuts its connection.

    >>> max_message_size(CollectorConfig()) - protocol.DEFAULT_LIMITS.max_bytes
    65536
    """
    return max(config.max_message_bytes, protocol.DEFAULT_LIMITS.max_bytes) + MAXMSGSIZE_MARGIN


def return_large_buffers() -> bool:
    """Have this process's large allocations (ZeroMQ's messages, their copies as bytes) made
    as pages of their own, given back to the system once freed. glibc otherwise raises its
    threshold to the largest block freed, and bursts of multi-megabyte messages stay in its
    heap for good. Process-wide: the daemon's ``main`` calls it. False where it is not glibc."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = libc.mallopt if libc is not None else None
    except (OSError, AttributeError):
        return False
    return mallopt is not None and bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))


class Receiver:
    """Frames in, validated messages out; acknowledgements back to their producers.
    ``screen(producer, nbytes)`` (``Delivery.screen``) says whether a large data message is
    worth decoding; one it refuses is let go at once (it counted it)."""

    def __init__(
        self,
        socket: Any,
        limits: protocol.Limits,
        health: Health,
        monitor: Any | None = None,
        screen: Callable[[int, int], bool] | None = None,
    ) -> None:
        self.socket = socket
        self.limits = limits
        self.health = health
        self.monitor = monitor
        self.screen = screen
        self._ratelog = RateLimitedLog(log)
        self._problems: list[SchemaError] = []
        """What the decoder forgave in the current message (a hello's bad tables)."""

    def receive(
        self, budget: int
    ) -> Iterator[tuple[bytes, protocol.Message | protocol.Rejected, bytes]]:
        """Up to ``budget`` waiting messages, without blocking: ``(identity, message, raw)``
        of each valid one, and of each rejected data message that can still be placed, a
        :class:`~rlpulse.schemas.protocol.Rejected` for the message (every reject is counted by
        reason)."""
        recv, health, problems, screen = self.socket.recv, self.health, self._problems, self.screen
        for _ in range(budget):
            # The identity, then the message as a frame (its ``more`` flag is cheaper to read
            # than recv_multipart's getsockopt per frame: a third of the per-message cost).
            try:
                identity = recv(_NOBLOCK)
            except zmq.Again:
                return
            frame = recv(_NOBLOCK, copy=False)
            health.messages_received += 1
            if frame.more:
                extra = 1
                while recv(_NOBLOCK, copy=False).more:
                    extra += 1
                health.reject("bad_frames")
                self._ratelog.warn(
                    "bad_frames", f"rejected a message of {extra + 1} frames (expected 1)"
                )
                continue
            if screen is not None:
                size = len(frame)
                if size >= SCREEN_BYTES:
                    producer = protocol.peek_producer(frame.buffer)
                    if producer is not None and not screen(producer, size):
                        continue  # let go undecoded, uncopied: counted by screen
            raw = frame.bytes
            try:
                msg = protocol.decode(raw, self.limits, problems)
            except SchemaError as exc:
                health.reject(exc.reason)
                self._ratelog.warn(
                    f"malformed:{exc.reason}", f"rejected a malformed message: {exc.detail}"
                )
                marker = protocol.rejected(raw, exc)
                if marker is not None:
                    yield identity, marker, raw
                continue
            if problems:
                for problem in problems:
                    health.reject(problem.reason)
                    self._ratelog.warn(
                        f"table:{problem.reason}",
                        f"left out a name table of producer {msg.producer:x}: {problem.detail}",
                    )
                problems.clear()
            yield identity, msg, raw

    def acknowledge(self, acks: list[tuple[bytes, bytes]]) -> None:
        # Two sends, not send_multipart: a quarter of the CPU per acknowledgement (1.8 against
        # 7 us here), which at 1,024 ranks was a tenth of the collector's cost per message.
        send = self.socket.send
        for identity, ack in acks:
            # A producer gone or slow to read resends, and is acknowledged again then.
            with contextlib.suppress(zmq.ZMQError):
                send(identity, _MORE)
                send(ack, _NOBLOCK)

    def count_handshake_failures(self) -> None:
        monitor = self.monitor
        while monitor is not None:
            try:
                monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.health.handshake_failed += 1
            self._ratelog.warn(
                "handshake", "refused a client: CurveZMQ handshake or authentication failed"
            )
