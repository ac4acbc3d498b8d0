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
from collector.delivery import Delivery
from collector.discovery import PUBLISH_S, Discovery
from collector.durable import DurableState
from collector.fanout import FanOut
from collector.health import Health
from collector.receiver import Endpoint, Receiver
from collector.relay import RelayAggregator
from collector.sinks import build_sink
from collector.sinks.base import Sink, SinkContext
from collector.upstream import UpstreamSink, relay_id
from schemas import protocol
from schemas.metrics import CATALOG

log = logging.getLogger("rlpulse.collector")
POLL_MS = 20
BATCH = 2000
"""Messages received between two checks of the step timers."""


class Collector:
    """The daemon, constructed from a config; ``run()`` blocks until ``stop()`` or a signal.

    ``sinks`` replaces the configured trackers (tests pass in-memory ones); ``environ`` is
    where the trackers' environment variables are read (``collector.env``).

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
        self._stop = threading.Event()
        self._closed = False
        self._opened: list[Sink] = []
        self.durable: DurableState | None = None
        self.discovery = Discovery()
        self._discovery_due = 0.0
        self._endpoint: Endpoint | None = None
        self._zmq = zmq.Context()
        try:
            self._start(sinks, environ)
        except BaseException:  # a start-up failure (a ConfigError) leaks nothing
            self._abort()
            raise

    def _start(self, sinks: Mapping[str, Sink] | None, environ: Mapping[str, str]) -> None:
        config, clock = self.config, self._clock
        ctx = SinkContext(
            catalog=CATALOG, health=self.health.snapshot, scrape_targets=self.discovery.targets
        )
        relay = None
        if config.upstream is not None:  # a relay: its one sink is the collector above
            relay = relay_id(config.state_dir)
            sinks = {UpstreamSink.name: UpstreamSink(config, relay)}
        elif sinks is None:
            sinks = {
                name: build_sink(name, kwargs, ctx, environ)
                for name, kwargs in config.trackers.items()
            }
        for sink in sinks.values():
            sink.open()
            self._opened.append(sink)
        if config.state_dir:
            self.durable = DurableState(config.state_dir, config)
        self.fanout = FanOut(sinks, config, durable=self.durable)
        self.health.sinks = self.fanout.stats
        kind = Aggregator if relay is None else RelayAggregator
        self.aggregator = kind(
            self.durable.emit if self.durable else self.fanout.put,
            config,
            health=self.health,
            catalog=CATALOG,
        )
        if isinstance(self.aggregator, RelayAggregator):
            self.aggregator.relay_id = relay
        self.delivery = Delivery(self.health)
        self.limits = protocol.Limits(
            max_bytes=config.max_message_bytes,
            max_names=config.max_names_per_entry,
            max_name_length=config.max_name_length,
        )
        if self.durable is not None:
            self.durable.recover(self.aggregator, self.delivery, self.limits, clock())
        self._endpoint = Endpoint(config, self._zmq)
        self.address: str = self._endpoint.address
        self.receiver = Receiver(
            self._endpoint.socket, self.limits, self.health, self._endpoint.monitor
        )

    def _abort(self) -> None:
        for sink in self._opened:
            try:
                sink.close()
            except Exception as exc:
                log.error("sink %s: close failed: %r", sink.name, exc)
        if self.durable is not None:
            self.durable.close()
        if self._endpoint is not None:
            self._endpoint.close()
        self._zmq.term()

    def stop(self) -> None:
        """Ask ``run()`` to drain and return (safe from signal handlers and other threads)."""
        self._stop.set()

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())

    def _receive(self, budget: int) -> int:
        """Handle up to ``budget`` waiting messages without blocking; return how many."""
        agg, durable, delivery = self.aggregator, self.durable, self.delivery
        received = self.health.messages_received
        now = self._clock()
        for identity, msg, raw in self.receiver.receive(budget):
            for accepted, payload in delivery.accept(msg, identity, raw):
                position = None
                if durable is not None and not isinstance(accepted, protocol.Heartbeat):
                    position = durable.log_input(payload)
                agg.handle(accepted, now, position)
        return self.health.messages_received - received

    def _settle(self) -> None:
        """Emit what is due, make it durable, wake the sinks, then acknowledge; now and then
        publish the registered endpoints for service discovery."""
        now = self._clock()
        self.aggregator.poll(now)
        if now >= self._discovery_due:
            self._discovery_due = now + PUBLISH_S
            self.discovery.publish(self.aggregator.membership.scrape_targets(now))
            self.health.scrape_targets = len(self.discovery.targets())
        if self.durable is not None:
            self.durable.commit()
            self.fanout.notify()
            self.durable.maybe_checkpoint(
                self.aggregator, self.delivery, [w.name for w in self.fanout.workers]
            )
        self.receiver.acknowledge(self.delivery.acks())
        self.receiver.count_handshake_failures()

    def run(self) -> None:
        """Serve until stopped, then drain what is queued, flush open steps and close sinks."""
        self.fanout.start()
        poller = zmq.Poller()
        poller.register(self.receiver.socket, zmq.POLLIN)
        log.info(
            "rlpulse collector listening on %s; trackers: %s%s%s",
            self.address,
            ", ".join(w.name for w in self.fanout.workers),
            f"; state in {self.config.state_dir}" if self.durable else "",
            "; CurveZMQ on" if self.config.curve is not None else "",
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
        if self.durable is None or self.config.upstream is not None:
            # In memory only: emit open steps now or lose them. A relay forwards them: the
            # root adds whatever its ranks send for them later, so nothing is made partial.
            self.aggregator.flush()
            if self.durable is not None:
                self.durable.commit()
                self.fanout.notify()
        else:
            open_steps = self.aggregator.open_steps()
            if open_steps:
                log.info(
                    "%d open steps kept in %s; they complete after the next start",
                    open_steps,
                    self.config.state_dir,
                )
            self.durable.commit()
            self.fanout.notify()
        self.receiver.acknowledge(self.delivery.acks())
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
        if self._endpoint is not None:
            self._endpoint.close()
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
