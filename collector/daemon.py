"""The collector daemon: receive, decode, aggregate, fan out; drain on SIGTERM/SIGINT.

One thread receives and aggregates (ZeroMQ ROUTER socket, polled with a short timeout so grace
periods and liveness are checked even when nothing arrives); every sink runs on its own
thread (``collector.fanout``).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import zmq

from collector.aggregator import Aggregator
from collector.config import CollectorConfig
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
        self.fanout = FanOut(
            sinks,
            queue_size=config.sink_queue,
            retries=config.sink_retries,
            close_s=config.sink_close_s,
        )
        self.health.sinks = self.fanout.stats
        self.aggregator = Aggregator(
            self.fanout.put,
            health=self.health,
            catalog=CATALOG,
            grace_s=config.grace_s,
            liveness_s=config.liveness_s,
            max_open_steps=config.max_open_steps,
            tps_window=config.tps_window,
        )
        self.limits = protocol.Limits(max_bytes=config.max_message_bytes)
        self._zmq = zmq.Context()
        self._socket = self._zmq.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.RCVHWM, 100_000)
        # Hard cap in libzmq (the peer is disconnected); the decoder's softer limit is counted.
        self._socket.setsockopt(zmq.MAXMSGSIZE, 4 * config.max_message_bytes)
        self._socket.bind(config.bind)
        self.address: str = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self._stop = threading.Event()
        self._ratelog = RateLimitedLog(log)
        self._closed = False

    def stop(self) -> None:
        """Ask ``run()`` to drain and return (safe from signal handlers and other threads)."""
        self._stop.set()

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())

    def _receive(self, budget: int) -> int:
        """Handle up to ``budget`` waiting messages without blocking; return how many."""
        sock, agg, health = self._socket, self.aggregator, self.health
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
            try:
                msg = protocol.decode(frames[1], self.limits)
            except SchemaError as exc:
                health.reject(exc.reason)
                self._ratelog.warn(
                    f"malformed:{exc.reason}", f"rejected a malformed message: {exc.detail}"
                )
                continue
            agg.handle(msg, now)
        return handled

    def run(self) -> None:
        """Serve until stopped, then drain what is queued, flush open steps and close sinks."""
        self.fanout.start()
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        log.info(
            "rlpulse collector listening on %s; trackers: %s",
            self.address,
            ", ".join(w.name for w in self.fanout.workers),
        )
        try:
            while not self._stop.is_set():
                if poller.poll(POLL_MS):
                    self._receive(BATCH)
                self.aggregator.poll(self._clock())
        finally:
            self.close()

    def close(self) -> None:
        """Drain the socket, emit open steps (partial where ranks are missing), close sinks."""
        if self._closed:
            return
        self._closed = True
        while self._receive(BATCH):
            pass
        self.aggregator.poll(self._clock())
        self.aggregator.flush()
        self._socket.close()
        self._zmq.term()
        abandoned = self.fanout.close()
        h = self.health
        log.info(
            "rlpulse collector stopped: %d messages, %d steps emitted (%d partial), %d late, "
            "%d malformed %s, producers dropped %d%s",
            h.messages_received,
            h.steps_emitted,
            h.partial_steps,
            h.late,
            sum(h.malformed.values()),
            json.dumps(dict(sorted(h.malformed.items()))),
            h.producer_dropped(),
            f"; abandoned sinks: {', '.join(abandoned)}" if abandoned else "",
        )


def write_ready_file(path: str | Path, address: str) -> None:
    """Tell a parent process where we listen: written atomically once the socket is bound."""
    target = Path(path)
    tmp = target.with_suffix(target.suffix + ".tmp")
    tmp.write_text(address + "\n")
    tmp.replace(target)
