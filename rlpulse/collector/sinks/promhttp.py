"""The HTTP server behind ``/metrics`` and ``/sd``, bounded against clients that abuse it,
the WSGI app that answers ``/metrics`` from the sink's cached text (gzipped when asked:
:func:`metrics_app`), and the TLS set-up (checked at start-up: :func:`check_tls`).

prometheus_client's ``start_http_server`` starts a thread per connection, with no cap, waits
for a request for ever, reads request heads of any size and listens with a backlog of 5. On a
collector's port that meant 822 threads for 1,000 slow clients, 49 -> 321 MB of memory (kept)
for clients sending endless headers, and 370 of 1,000 parallel scrapes timing out. Here one
thread reads the request heads of every open connection (non-blocking, a selector), and only
a whole request goes to one of ``WORKERS`` threads, which answers it and closes:

* at most ``MAX_OPEN`` connections are open at once; more wait in the listen queue
  (``BACKLOG``); a slow client costs a socket and its bytes so far, not a thread, and never
  holds up a scrape that arrives whole;
* a connection must deliver its whole request head within ``REQUEST_TIMEOUT_S`` of being
  accepted, or it is closed (idle, half-open and slow-loris clients), counted in
  ``rlpulse_collector_http_timeouts_total``;
* a head larger than ``MAX_HEAD_BYTES`` is answered 431 and closed, counted in
  ``rlpulse_collector_http_oversized_total``;
* sending the answer to a client that does not read it gives up after ``REQUEST_TIMEOUT_S``
  without progress. One request per connection, as before (wsgiref's handler).

Serving never touches the collector's receive path: ingestion goes on whatever the port sees.

>>> server = BoundedServer.start("127.0.0.1", 0, lambda env, start: [])
>>> server.stats()
{'http_timeouts': 0, 'http_oversized': 0}
>>> server.close()
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import io
import logging
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client.exposition import choose_encoder, gzip_accepted

from rlpulse.collector.health import HTTP_OVERSIZED, HTTP_TIMEOUTS
from rlpulse.schemas.errors import ConfigError

log = logging.getLogger(__name__)

WORKERS = 8
"""Threads answering whole requests (rendering is cached: a scrape takes a millisecond or so)."""
MAX_OPEN = 1024
"""Connections open at once, reading their request or being answered; more wait in the
listen queue until one closes."""
BACKLOG = 1024
"""Connections the kernel keeps waiting to be accepted (capped by ``net.core.somaxconn``)."""
REQUEST_TIMEOUT_S = 5.0
"""A request head must arrive whole within this many seconds of the connection's accept."""
MAX_HEAD_BYTES = 16 * 1024
"""The largest request head (request line and headers) read; Prometheus sends a few hundred."""
POLL_S = 0.2
"""The reading thread's longest sleep (it checks deadlines and room to accept in between)."""
_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\n"
    b"Content-Length: 0\r\n\r\n"
)

Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


@dataclass
class _Reading:
    """A connection whose request head is on its way."""

    deadline: float
    head: bytearray = field(default_factory=bytearray)


class _SendAll(io.RawIOBase):
    """The answer's stream: every write sent whole (under the socket's timeout)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._sock.sendall(data)
        return len(data)


class _Handler(WSGIRequestHandler):
    """wsgiref's handler of one request whose head was already read: ``request`` is
    ``(socket, head)``."""

    def setup(self) -> None:
        self.connection, head = self.request
        self.rfile = io.BytesIO(head)
        # wsgiref only writes to wfile: a raw stream that sends each write whole will do
        self.wfile = _SendAll(self.connection)  # type: ignore[assignment]

    def finish(self) -> None:
        pass  # the server closes the socket

    def log_message(self, format: str, *args: Any) -> None:
        """Log nothing per request (as prometheus_client's handler)."""


class BoundedServer(WSGIServer):
    """A WSGI server with bounded connections, threads, waits and request sizes (see the
    module docstring); :meth:`start` runs it, :meth:`close` stops it (safe twice)."""

    request_queue_size = BACKLOG

    def __init__(
        self,
        address: tuple[str, int],
        family: socket.AddressFamily,
        tls: ssl.SSLContext | None = None,
        *,
        workers: int = WORKERS,
        max_open: int = MAX_OPEN,
    ) -> None:
        self.address_family = family
        super().__init__(address, _Handler)
        self.socket.setblocking(False)
        self._tls = tls
        self._max_open = max_open
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="rlpulse-metrics-http")
        self._lock = threading.Lock()
        self._answering = 0
        """Connections handed to the workers, not closed yet."""
        self._stats = {HTTP_TIMEOUTS.key: 0, HTTP_OVERSIZED.key: 0}
        self._stop = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._thread: threading.Thread | None = None

    @classmethod
    def start(
        cls, host: str, port: int, app: Wsgi, tls: ssl.SSLContext | None = None
    ) -> BoundedServer:
        """Listen on ``host:port`` (OSError if it cannot) and serve ``app``."""
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, sockaddr = infos[0]
        server = cls((str(sockaddr[0]), port), family, tls)
        server.set_app(app)
        server._thread = threading.Thread(
            target=server._read_heads, name="rlpulse-metrics-http", daemon=True
        )
        server._thread.start()
        return server

    def close(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        self._wake()
        thread.join(timeout=5)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.server_close()
        self._wake_r.close()
        self._wake_w.close()

    def stats(self) -> dict[str, int]:
        """The server's counters by ``SelfMetric`` key (``health.HTTP_METRICS``)."""
        with self._lock:
            return dict(self._stats)

    def _count(self, key: str) -> None:
        with self._lock:
            self._stats[key] += 1

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # full (a wake-up is pending anyway) or closed
            self._wake_w.send(b"\0")

    # --- the reading thread ---

    def _read_heads(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._wake_r, selectors.EVENT_READ)
        reading: dict[socket.socket, _Reading] = {}
        listening = False
        try:
            while not self._stop.is_set():
                with self._lock:
                    room = len(reading) + self._answering < self._max_open
                if room != listening:  # full: new connections wait in the listen queue
                    if room:
                        sel.register(self.socket, selectors.EVENT_READ)
                    else:
                        sel.unregister(self.socket)
                    listening = room
                now = time.monotonic()
                soonest = min((r.deadline for r in reading.values()), default=now + POLL_S)
                for key, _ in sel.select(max(0.0, min(soonest - now, POLL_S))):
                    sock = key.fileobj
                    if sock is self.socket:
                        self._accept(sel, reading)
                    elif sock is self._wake_r:
                        while True:
                            try:
                                if not self._wake_r.recv(4096):
                                    break
                            except BlockingIOError:
                                break
                    else:
                        self._read(sel, reading, sock)  # type: ignore[arg-type]
                now = time.monotonic()
                for sock in [s for s, r in reading.items() if r.deadline <= now]:
                    self._count(HTTP_TIMEOUTS.key)
                    self._drop(sel, reading, sock)
        finally:
            for sock in list(reading):
                self._drop(sel, reading, sock)
            sel.close()

    def _accept(self, sel: selectors.BaseSelector, reading: dict) -> None:
        with self._lock:
            free = self._max_open - len(reading) - self._answering
        for _ in range(max(free, 0)):
            try:
                sock, _ = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors: leave the rest queued for now
                log.debug("metrics http: accept failed: %s", exc)
                return
            sock.setblocking(False)
            if self._tls is not None:
                try:
                    sock = self._tls.wrap_socket(
                        sock, server_side=True, do_handshake_on_connect=False
                    )
                except OSError:
                    sock.close()
                    continue
            reading[sock] = _Reading(time.monotonic() + REQUEST_TIMEOUT_S)
            sel.register(sock, selectors.EVENT_READ)

    def _read(self, sel: selectors.BaseSelector, reading: dict, sock: socket.socket) -> None:
        state = reading[sock]
        try:
            while True:
                chunk = sock.recv(4096)
                if not chunk:
                    self._drop(sel, reading, sock)  # the client went away
                    return
                state.head += chunk
                if len(state.head) > MAX_HEAD_BYTES or not (
                    isinstance(sock, ssl.SSLSocket) and sock.pending()
                ):
                    break
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            pass  # a TLS handshake under way, or nothing more yet
        except OSError:  # reset, a failed TLS handshake: nothing to answer
            self._drop(sel, reading, sock)
            return
        head = state.head
        if b"\r\n\r\n" in head or b"\n\n" in head:
            self._forget(sel, reading, sock)
            with self._lock:
                self._answering += 1
            self._pool.submit(self._answer, sock, bytes(head))
        elif len(head) > MAX_HEAD_BYTES:
            self._count(HTTP_OVERSIZED.key)
            with contextlib.suppress(OSError):
                sock.send(_TOO_LARGE)
            self._drop(sel, reading, sock)

    @staticmethod
    def _forget(sel: selectors.BaseSelector, reading: dict, sock: socket.socket) -> None:
        del reading[sock]
        sel.unregister(sock)

    def _drop(self, sel: selectors.BaseSelector, reading: dict, sock: socket.socket) -> None:
        self._forget(sel, reading, sock)
        sock.close()

    # --- the workers ---

    def _answer(self, sock: socket.socket, head: bytes) -> None:
        try:
            sock.setblocking(True)
            sock.settimeout(REQUEST_TIMEOUT_S)  # a client that does not read its answer
            # The request is (socket, head already read): _Handler.setup takes it apart.
            _Handler((sock, head), sock.getpeername(), self)  # type: ignore[arg-type]
        except Exception:  # a client gone mid-answer is no error of ours
            log.debug("metrics http: a request failed", exc_info=True)
        finally:
            sock.close()
            with self._lock:
                self._answering -= 1
            self._wake()


def tls_context(certfile: str, keyfile: str) -> ssl.SSLContext:
    """A server TLS context with ``certfile``/``keyfile`` (OSError if they do not load)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certfile=certfile, keyfile=keyfile)
    return context


GZIP_LEVEL = 1
"""Compression of /metrics for clients that accept gzip (a Prometheus server does). Not
prometheus_client's 9: that took 0.3 ms of CPU for a 21 kB body, as much as the rest of a
scrape, where 1 takes 0.09 ms for a body 10% larger."""
WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def metrics_app(exposition: Callable[[Any, str], bytes], plain: WSGIApp) -> WSGIApp:
    """``prometheus_client.make_wsgi_app(registry)`` (``plain``), but for the body of a plain
    GET, which comes from ``exposition(encoder, content_type)``, gzipped at ``GZIP_LEVEL``
    for a client that accepts it."""

    def serve(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        params = parse_qs(environ.get("QUERY_STRING", ""))
        if (
            environ["REQUEST_METHOD"] != "GET"
            or environ.get("PATH_INFO") == "/favicon.ico"
            or "name[]" in params
        ):
            return plain(environ, start_response)
        encoder, content_type = choose_encoder(environ.get("HTTP_ACCEPT", ""))
        output = exposition(encoder, content_type)
        headers = [("Content-Type", content_type)]
        if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):  # as a Prometheus server asks
            output = gzip.compress(output, compresslevel=GZIP_LEVEL)
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return [output]

    return serve


def start_server(
    host: str,
    port: int,
    app: WSGIApp,
    certfile: str | None,
    keyfile: str | None,
    *,
    field: str,
) -> BoundedServer:
    """Serve ``app`` on ``host:port`` (TLS with both files). An address that cannot be
    listened on (in use, not an address of this machine) raises ConfigError naming
    ``field.port`` or ``field.host``."""
    tls = tls_context(certfile, keyfile) if certfile is not None and keyfile is not None else None
    try:
        return BoundedServer.start(host, port, app, tls)
    except OSError as exc:
        where = f"{host}:{port}"
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"{field}.port", f"cannot listen on {where}: the port is already in use", port
            ) from None
        raise ConfigError(
            f"{field}.host", f"cannot listen on {where}: {exc.strerror or exc}", host
        ) from None


def check_tls(certfile: str, keyfile: str, field: str) -> None:
    """Load the pair as the server will, so a wrong file fails at start-up naming ``field``."""
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(certfile, keyfile)
    except ssl.SSLError as exc:
        try:  # the usual mistake, worth saying so
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(keyfile, certfile)
        except ssl.SSLError:
            raise ConfigError(
                f"{field}.certfile",
                f"cannot load the certificate {certfile!r} with the private key {keyfile!r} "
                f"({exc.reason or exc}): certfile must hold the PEM certificate and keyfile "
                "its private key",
            ) from None
        raise ConfigError(
            f"{field}.certfile",
            f"certfile and keyfile are swapped: {certfile!r} holds the private key and "
            f"{keyfile!r} the certificate",
        ) from None
