"""How a producer's bytes reach the collector: a small protocol, over ZeroMQ or in memory.

The sender thread (``rlpulse.producer.sender``) only ever calls :class:`Transport`: non-blocking
``send``/``receive`` of whole messages, and the connection's ups and downs as events. The
ZeroMQ transport is what runs in workers; :class:`MemoryTransport` lets tests drive a
producer with no socket at all, connecting, dropping and answering as they please.
"""

from __future__ import annotations

import enum
import os
import re
import threading
from collections import deque
from dataclasses import dataclass
from typing import Protocol, cast

import zmq

from rlpulse.schemas.errors import ConfigError


@dataclass(frozen=True)
class CurveKeys:
    """CurveZMQ keys (Z85 bytes): the collector's public key and this client's key pair."""

    server_public: bytes
    public: bytes
    secret: bytes


class Link(enum.Enum):
    """What happened to the connection."""

    CONNECTED = "connected"
    DISCONNECTED = "disconnected"
    REFUSED = "refused"
    """A connection attempt found nobody listening."""


@dataclass(frozen=True)
class Rejected:
    """A collector answered the connection but refused its handshake; ``why`` says why, in
    words (what ZeroMQ's handshake events tell: a security mechanism the other side does not
    use, a key its authentication refused, a key exchange that failed)."""

    why: str
    final: bool = True
    """ZeroMQ gives the connection up (a mechanism mismatch, a refused key: it never tries
    again); False when it keeps trying (a handshake that failed with no detail)."""


Event = Link | Rejected
"""What :meth:`Transport.events` reports."""


class Transport(Protocol):
    """A message pipe to one collector; used from the sender thread only."""

    def send(self, payload: bytes) -> bool:
        """Queue one message without blocking; False when it cannot go now (nothing queued)."""
        ...

    def receive(self) -> bytes | None:
        """The next message from the collector, or None; never blocks."""
        ...

    def events(self, wait_s: float = 0.0) -> list[Event]:
        """Connection events since the last call; with ``wait_s``, wait that long for one."""
        ...

    def close(self) -> None: ...


class TransportError(RuntimeError):
    """A send failed for a reason other than "not now" (counted by the sender)."""


ADDRESS_FORM = "tcp://HOST:PORT (e.g. tcp://127.0.0.1:5555), or ipc://PATH"
"""What a collector address looks like, as error messages show it."""
_TCP = re.compile(r"tcp://(\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+):([0-9]{1,5})")


def check_address(address: object) -> str:
    """``address`` when ZeroMQ can connect a producer to it; else :class:`ConfigError`
    naming ``address`` and showing :data:`ADDRESS_FORM` (a raw ``ZMQError`` says neither).

    >>> check_address("tcp://127.0.0.1:5555")
    'tcp://127.0.0.1:5555'
    >>> try:
    ...     check_address("127.0.0.1:5555")
    ... except ConfigError as exc:
    ...     print(exc.field, exc.value)
    address 127.0.0.1:5555
    """
    if isinstance(address, str):
        tcp = _TCP.fullmatch(address)
        if tcp is not None and 0 < int(tcp.group(2)) < 65536:
            return address
        if address.startswith("ipc://") and len(address) > len("ipc://"):
            return address
    raise ConfigError("address", f"must be {ADDRESS_FORM}", address)


@dataclass(frozen=True)
class Client:
    """Who connects, as a refusal's reason names it: what it is and where its keys are set."""

    noun: str
    keys: str
    """Where its CurveZMQ keys are given."""
    server_key: str
    """Where the collector's public key is given."""


PRODUCER = Client(
    "producer",
    "curve=, or RLPULSE_CURVE_SERVER_KEY and RLPULSE_CURVE_CLIENT_CERT: docs/security.md",
    "RLPULSE_CURVE_SERVER_KEY",
)
RELAY = Client(
    "relay",
    "upstream_curve: {server_key, client_cert} in its config: docs/runs-and-relays.md",
    "upstream_curve.server_key",
)
"""A relay's link to the collector above it (``rlpulse.collector.tiers.upstream``)."""
_ZAP_STATUS = {
    300: "a temporary error in its authentication (ZAP status 300): try again later",
    400: "its authentication refused this {noun}'s public key (ZAP status 400): the key "
    "is not among the collector's allowed clients (curve.clients_dir: docs/security.md)",
    500: "an internal error in its authentication (ZAP status 500): see the collector's log",
}
NO_DETAIL_REPEATS = 3
"""Handshakes failing with no detail, in a row, before they count as a refusal: one alone may
be a collector stopping mid-handshake; a wrong server key fails every attempt."""


def refusal(event: int, value: int, curve: bool, client: Client = PRODUCER) -> Rejected | None:
    """A collector's refusal of the handshake, from a ZeroMQ monitor event and its value, for
    a ``client`` with (``curve``) or without CurveZMQ keys; None for other events."""
    why = _why(event, value, curve, client)
    if why is None:
        return None
    return Rejected(why, final=event != zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


def _why(event: int, value: int, curve: bool, client: Client) -> str | None:
    noun = client.noun
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        zap = _ZAP_STATUS.get(value, "its authentication refused this {noun} (ZAP status {value})")
        return zap.format(noun=noun, value=value)
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        if value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
            if curve:
                return (
                    f"it does not use CurveZMQ and this {noun} does ({client.keys}): turn it "
                    "on there or off here"
                )
            return f"it requires CurveZMQ and this {noun} has no keys: give them ({client.keys})"
        if value == zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
            return "the CurveZMQ handshake failed cryptographically: a wrong server key?"
        names = [
            k for k in dir(zmq) if k.startswith("PROTOCOL_ERROR_") and getattr(zmq, k) == value
        ]
        name = names[0] if names else str(value)
        return f"the handshake broke the ZeroMQ protocol ({name}): is it an rlpulse collector?"
    if event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL and curve:
        return (
            "the CurveZMQ handshake failed with no detail, again and again: the server key "
            f"this {noun} has ({client.server_key}) is not the collector's?"
        )
    return None


class ZmqTransport:
    """A DEALER socket connected to ``address``. ``ZMQ_IMMEDIATE`` keeps ZeroMQ from queueing
    for a collector that is not connected (the producer's own buffer holds the data), and
    ``LINGER 0`` keeps close from hanging on undelivered messages. Its monitor also reports
    handshakes the collector refused (:class:`Rejected`): ZeroMQ retries neither a refused
    key nor a mechanism mismatch, so without it they look like a collector never reached."""

    def __init__(
        self,
        address: str,
        *,
        sndhwm: int,
        curve: CurveKeys | None = None,
        context: zmq.Context | None = None,
        client: Client = PRODUCER,
    ) -> None:
        self._client = client
        """Who connects, as a refusal names it (a producer, or a relay's upstream link)."""
        self._context = context or zmq.Context()
        self._socket = self._context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SNDHWM, sndhwm)
        self._socket.setsockopt(zmq.IMMEDIATE, 1)
        if curve is not None:
            self._socket.curve_serverkey = curve.server_public
            self._socket.curve_publickey = curve.public
            self._socket.curve_secretkey = curve.secret
        self._curve = curve is not None
        self._no_detail = 0
        """Handshakes failed with no detail since the last one that succeeded."""
        self._monitor = self._socket.get_monitor_socket(
            zmq.EVENT_CONNECTED
            | zmq.EVENT_DISCONNECTED
            | zmq.EVENT_CONNECT_RETRIED
            | zmq.EVENT_HANDSHAKE_SUCCEEDED
            | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
            | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
            | zmq.EVENT_HANDSHAKE_FAILED_AUTH
        )
        try:
            self._socket.connect(check_address(address))
        except (ConfigError, zmq.ZMQError) as exc:
            self.close()
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError("address", f"{exc}; expected {ADDRESS_FORM}", address) from None

    def send(self, payload: bytes) -> bool:
        try:
            self._socket.send(payload, zmq.NOBLOCK)
        except zmq.Again:
            return False
        except zmq.ZMQError as exc:
            raise TransportError(str(exc)) from None
        return True

    def receive(self) -> bytes | None:
        if not cast(int, self._socket.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            return None  # the cheap check: no exception, no poll
        try:
            return self._socket.recv(zmq.NOBLOCK)
        except zmq.Again:
            return None

    def events(self, wait_s: float = 0.0) -> list[Event]:
        monitor, out = self._monitor, cast(list[Event], [])
        if wait_s > 0 and not monitor.poll(int(wait_s * 1000)):
            return out
        while cast(int, monitor.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            frame = monitor.recv_multipart()[0]  # event (2 bytes) and value (4), little-endian
            event = int.from_bytes(frame[:2], "little")
            if event == zmq.EVENT_CONNECT_RETRIED:
                out.append(Link.REFUSED)
            elif event == zmq.EVENT_CONNECTED:
                out.append(Link.CONNECTED)
            elif event == zmq.EVENT_DISCONNECTED:
                out.append(Link.DISCONNECTED)
            elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._no_detail = 0
            else:
                if event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                    self._no_detail += 1
                    if self._no_detail < NO_DETAIL_REPEATS:
                        continue
                value = int.from_bytes(frame[2:6], "little")
                rejected = refusal(event, value, self._curve, self._client)
                if rejected is not None:
                    out.append(rejected)
        return out

    def close(self) -> None:
        self._socket.disable_monitor()
        self._monitor.close(linger=0)
        self._socket.close(linger=0)
        self._context.term()


class MemoryTransport:
    """A transport with the collector's end in the test's hands.

    ``sent`` holds what the producer sent; ``reply()`` queues a message for it; ``connect()``,
    ``disconnect()``, ``refuse()`` and ``reject(why)`` raise connection events; ``accepting = False`` makes
    sends fail as ZeroMQ does mid-handshake.

    >>> t = MemoryTransport()
    >>> t.connect(); t.events()
    [<Link.CONNECTED: 'connected'>]
    """

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.accepting = True
        self.closed = False
        self._replies: deque[bytes] = deque()
        self._events: deque[Event] = deque()
        self._signal = threading.Event()

    def connect(self) -> None:
        self._event(Link.CONNECTED)

    def disconnect(self) -> None:
        self._event(Link.DISCONNECTED)

    def refuse(self) -> None:
        self._event(Link.REFUSED)

    def reject(self, why: str, final: bool = True) -> None:
        """A collector answered and refused the handshake (as :class:`ZmqTransport` reports)."""
        self._event(Rejected(why, final))

    def reply(self, payload: bytes) -> None:
        self._replies.append(payload)

    def _event(self, event: Event) -> None:
        self._events.append(event)
        self._signal.set()

    def send(self, payload: bytes) -> bool:
        if not self.accepting or self.closed:
            return False
        self.sent.append(payload)
        return True

    def receive(self) -> bytes | None:
        return self._replies.popleft() if self._replies else None

    def events(self, wait_s: float = 0.0) -> list[Event]:
        if wait_s > 0 and not self._events:
            self._signal.wait(wait_s)
        self._signal.clear()
        out: list[Event] = []
        while self._events:
            out.append(self._events.popleft())
        return out

    def close(self) -> None:
        self.closed = True


def load_curve(server_key: str, client_cert: str) -> CurveKeys:
    """Read keys made by ``python -m rlpulse.collector keygen`` (zmq.auth certificate files)."""
    import zmq.auth

    if os.path.exists(server_key):
        server_public, _ = zmq.auth.load_certificate(server_key)
    else:
        server_public = server_key.encode()
    public, secret = zmq.auth.load_certificate(client_cert)
    if secret is None:
        raise ValueError(f"{client_cert} holds no secret key: pass the *.key_secret file")
    return CurveKeys(server_public=server_public, public=public, secret=secret)
