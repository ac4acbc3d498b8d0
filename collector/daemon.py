"""The collector daemon: receive, deduplicate, log, aggregate, fan out, acknowledge.

One thread receives and aggregates (ZeroMQ ROUTER socket, polled with a short timeout so grace
periods and liveness are checked even when nothing arrives); every sink runs on its own
thread (``collector.fanout``). Per receive batch:

1. decode and validate each message (rejects counted by reason, logged with rate limiting);
2. deduplicate and order it per producer (``collector.delivery``);
3. append it to the write-ahead log (with ``state_dir``) and apply it to the aggregator;
4. emit finished steps (to the outbox with ``state_dir``, else to the sinks' queues);
5. make the logs durable, wake the sinks, and only then acknowledge to the producers.

SIGTERM/SIGINT: drain the socket, then emit open steps flagged partial (without
``state_dir``; with it they stay in the log and complete after the next start), write and
close the sinks, exit 0.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from collector.aggregator import Aggregator
from collector.config import CollectorConfig
from collector.delivery import Delivery
from collector.durable import DurableState
from collector.fanout import FanOut
from collector.health import Health
from collector.ratelog import RateLimitedLog
from collector.sinks import build_sink
from collector.sinks.base import Sink, SinkContext
from schemas import protocol
from schemas.errors import SchemaError
from schemas.metrics import CATALOG

log = logging.getLogger("rlpulse.collector")
POLL_MS = 20
BATCH = 2000
"""Messages received between two checks of the step timers."""
_HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)


class Collector:
    """The daemon, constructed from a config; ``run()`` blocks until ``stop()`` or a signal.

    ``sinks`` replaces the configured trackers (tests pass in-memory ones).

    >>> # c = Collector(CollectorConfig.load("collector.yaml")); c.run()
    """

    def __init__(
        self,
        config: CollectorConfig,
        *,
        sinks: Mapping[str, Sink] | None = None,
        clock: Callable[[], float] = time.monotonic,
        environ: Mapping[str, str] = os.environ,
    ) -> None:
        self.config = config
        self.health = Health()
        self._clock = clock
        ctx = SinkContext(catalog=CATALOG, health=self.health.snapshot, environ=environ)
        if sinks is None:
            sinks = {
                name: build_sink(name, kwargs, ctx) for name, kwargs in config.trackers.items()
            }
        for sink in sinks.values():
            sink.open()
        self.durable = (
            DurableState(
                config.state_dir,
                fsync=config.fsync,
                segment_bytes=config.segment_bytes,
                checkpoint_s=config.checkpoint_s,
            )
            if config.state_dir
            else None
        )
        self.fanout = FanOut(
            sinks,
            queue_size=config.sink_queue,
            retries=config.sink_retries,
            close_s=config.sink_close_s,
            durable=self.durable,
        )
        self.health.sinks = self.fanout.stats
        self.aggregator = Aggregator(
            self.durable.emit if self.durable else self.fanout.put,
            health=self.health,
            catalog=CATALOG,
            grace_s=config.grace_s,
            liveness_s=config.liveness_s,
            max_open_steps=config.max_open_steps,
            tps_window=config.tps_window,
            max_names_per_run=config.max_names_per_run,
            settle_s=config.settle_s,
        )
        self.delivery = Delivery(self.health)
        self.limits = protocol.Limits(
            max_bytes=config.max_message_bytes,
            max_names=config.max_names_per_entry,
            max_name_length=config.max_name_length,
        )
        if self.durable is not None:
            self.durable.recover(self.aggregator, self.delivery, self.limits, clock())
        self._zmq = zmq.Context()
        self._auth: ThreadAuthenticator | None = None
        self._socket = self._zmq.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.RCVHWM, 100_000)
        # Hard cap in libzmq (the peer is disconnected); the decoder's softer limit is counted.
        self._socket.setsockopt(zmq.MAXMSGSIZE, 4 * config.max_message_bytes)
        self._monitor = None
        if config.curve is not None:
            self._secure(config.curve)
        try:
            self._socket.bind(config.bind)
        except zmq.ZMQError as exc:  # in use, not an address of this machine, bad transport
            from collector.errors import ConfigError

            raise ConfigError(
                "bind", f"cannot listen there: {zmq.strerror(exc.errno)}", config.bind
            ) from None
        self.address: str = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self._stop = threading.Event()
        self._ratelog = RateLimitedLog(log)
        self._closed = False

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
        self._auth = ThreadAuthenticator(self._zmq)
        self._auth.start()
        self._auth.configure_curve(domain="*", location=str(clients))
        public, secret = zmq.auth.load_certificate(str(curve["server_cert"]))
        if secret is None:
            from collector.errors import ConfigError

            raise ConfigError(
                "curve.server_cert",
                "holds no secret key: use the *.key_secret file",
                curve["server_cert"],
            )
        self._socket.curve_secretkey = secret
        self._socket.curve_publickey = public
        self._socket.curve_server = True
        self._monitor = self._socket.get_monitor_socket(_HANDSHAKE_FAILED)

    def stop(self) -> None:
        """Ask ``run()`` to drain and return (safe from signal handlers and other threads)."""
        self._stop.set()

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())

    def _receive(self, budget: int) -> int:
        """Handle up to ``budget`` waiting messages without blocking; return how many."""
        sock, agg, health, durable = self._socket, self.aggregator, self.health, self.durable
        handled = 0
        now = self._clock()
        while handled < budget:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            handled += 1
            health.messages_received += 1
            if len(frames) != 2:
                health.reject("bad_frames")
                self._ratelog.warn(
                    "bad_frames", f"rejected a message of {len(frames) - 1} frames (expected 1)"
                )
                continue
            identity, raw = frames
            try:
                msg = protocol.decode(raw, self.limits)
            except SchemaError as exc:
                health.reject(exc.reason)
                self._ratelog.warn(
                    f"malformed:{exc.reason}", f"rejected a malformed message: {exc.detail}"
                )
                continue
            for accepted, payload in self.delivery.accept(msg, identity, raw):
                position = None
                if durable is not None and not isinstance(accepted, protocol.Heartbeat):
                    position = durable.log_input(payload)
                agg.handle(accepted, now, position)
        return handled

    def _settle(self) -> None:
        """Emit what is due, make it durable, wake the sinks, then acknowledge."""
        self.aggregator.poll(self._clock())
        if self.durable is not None:
            self.durable.commit()
            self.fanout.notify()
            self.durable.maybe_checkpoint(
                self.aggregator, self.delivery, [w.name for w in self.fanout.workers]
            )
        self._send_acks()
        self._count_handshake_failures()

    def _send_acks(self) -> None:
        for identity, ack in self.delivery.acks():
            # A producer gone or slow to read resends, and is acknowledged again then.
            with contextlib.suppress(zmq.ZMQError):
                self._socket.send_multipart([identity, ack], zmq.NOBLOCK)

    def _count_handshake_failures(self) -> None:
        monitor = self._monitor
        while monitor is not None:
            try:
                monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.health.handshake_failed += 1
            self._ratelog.warn(
                "handshake", "refused a client: CurveZMQ handshake or authentication failed"
            )

    def run(self) -> None:
        """Serve until stopped, then drain what is queued, flush open steps and close sinks."""
        self.fanout.start()
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        log.info(
            "rlpulse collector listening on %s; trackers: %s%s%s",
            self.address,
            ", ".join(w.name for w in self.fanout.workers),
            f"; state in {self.config.state_dir}" if self.durable else "",
            "; CurveZMQ on" if self._auth else "",
        )
        try:
            while not self._stop.is_set():
                if poller.poll(POLL_MS):
                    self._receive(BATCH)
                self._settle()
        finally:
            self.close()

    def close(self) -> None:
        """Drain the socket, emit or keep open steps (see the module docstring), close sinks."""
        if self._closed:
            return
        self._closed = True
        while self._receive(BATCH):
            pass
        self._settle()
        if self.durable is None:
            self.aggregator.flush()  # in memory only: emit open steps now or lose them
        else:
            open_steps = sum(len(run.steps) for run in self.aggregator.runs.values())
            if open_steps:
                log.info(
                    "%d open steps kept in %s; they complete after the next start",
                    open_steps,
                    self.config.state_dir,
                )
            self.durable.commit()
            self.fanout.notify()
        self._send_acks()
        self.health.unapplied += self.delivery.unapplied()
        if self.health.unapplied:
            log.warning(
                "%d log() entries from producers that never registered were not applied",
                self.health.unapplied,
            )
        abandoned = self.fanout.close()
        if self.durable is not None:
            self.durable.maybe_checkpoint(
                self.aggregator, self.delivery, [w.name for w in self.fanout.workers], force=True
            )
            self.durable.close()
        if self._monitor is not None:
            self._socket.disable_monitor()
            self._monitor.close(linger=0)
        self._socket.close()
        if self._auth is not None:
            self._auth.stop()
        self._zmq.term()
        h = self.health
        log.info(
            "rlpulse collector stopped: %d messages, %d steps emitted (%d partial), %d late, "
            "%d malformed %s, %d duplicates, %d handshake failures, producers dropped %d, "
            "%d entries never applied (no registration)%s",
            h.messages_received,
            h.steps_emitted,
            h.partial_steps,
            h.late,
            sum(h.malformed.values()),
            json.dumps(dict(sorted(h.malformed.items()))),
            h.duplicates,
            h.handshake_failed,
            h.producer_dropped(),
            h.unapplied,
            f"; abandoned sinks: {', '.join(abandoned)}" if abandoned else "",
        )


def write_ready_file(path: str | Path, address: str) -> None:
    """Tell a parent process where we listen: written atomically once the socket is bound."""
    target = Path(path)
    tmp = target.with_suffix(target.suffix + ".tmp")
    tmp.write_text(address + "\n")
    tmp.replace(target)
