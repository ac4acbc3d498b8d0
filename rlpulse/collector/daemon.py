"""The collector daemon: receive, deduplicate, log, aggregate, fan out, acknowledge.

One thread receives and aggregates (ZeroMQ ROUTER socket, polled with a short timeout so grace
periods and liveness are checked even when nothing arrives); every sink runs on its own
thread (``rlpulse.collector.output.fanout``). Per receive batch:

1. decode and validate each message (rejects counted by reason, logged with rate limiting);
2. deduplicate and order it per producer (``rlpulse.collector.intake.delivery``);
3. append it to the write-ahead log (with ``state_dir``) and apply it to the aggregator;
4. emit finished steps (to the outbox with ``state_dir``, else to the sinks' queues);
5. make the logs durable, wake the sinks, and only then acknowledge to the producers.

SIGHUP (``systemctl reload``, logrotate's ``postrotate``): every sink reopens the files it
writes at their paths before its next step (:meth:`Collector.reopen`); nothing else changes.

SIGTERM/SIGINT: drain the socket, then emit open steps flagged partial (without
``state_dir``; with it they stay in the log and complete after the next start), write and
close the sinks, exit 0. SIGUSR1 (:meth:`Collector.finish`): the job is over, so open steps
are emitted and written even with ``state_dir`` (``rlpulse.collector.onray``'s ``stop()``); what a
stop left unwritten is then in ``state_dir/stopped.json``.

A full disk under ``state_dir``: a write of the logs that fails leaves nothing half written
and is retried every ``RETRY_S``; meanwhile nothing is received or acknowledged (producers keep
their data and resend it), step timers stand still, ``rlpulse_collector_state_writable`` is 0
and ``rlpulse_collector_disk_errors_total`` counts the failures; one error is logged, then a
reminder a minute at most. Writing resumes by itself once there is space.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import zmq

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.durability.durable import DurableState
from rlpulse.collector.health import Health
from rlpulse.collector.intake.delivery import Delivery
from rlpulse.collector.intake.receiver import Endpoint, Receiver
from rlpulse.collector.loopclock import LoopClock
from rlpulse.collector.output.discovery import PUBLISH_S, Discovery
from rlpulse.collector.output.fanout import FanOut
from rlpulse.collector.ratelog import RateLimitedLog
from rlpulse.collector.runs.aggregator import Aggregator
from rlpulse.collector.sinks import build_sink
from rlpulse.collector.sinks.base import Sink, SinkContext
from rlpulse.collector.stopreport import log_stopped, refusals, write_stop_report
from rlpulse.collector.tiers.relay import Relay
from rlpulse.collector.tiers.upstream import UpstreamSink, relay_id
from rlpulse.schemas import protocol
from rlpulse.schemas.metrics import CATALOG

log = logging.getLogger("rlpulse.collector")
POLL_MS = 20
SETTLE_S = 0.002
"""Emitting, making durable and acknowledging run at most this often while messages stream
in (once per message was a fixed cost of every message); a step goes out at most this much
later than the data that completes it."""
BATCH = 2000
"""Messages received between two checks of the step timers."""
RETRY_S = 1.0
"""While ``state_dir`` cannot be written (a full disk), how often writing is tried again."""
LAST_ACKS_S = 0.3
"""At a stop, how long the socket stays open after the last acknowledgements
(``Ack.stopping``), at least: a producer reads them within its sender's poll (0.1 s), and
its ZeroMQ socket drops what it has not read when the connection closes. One that missed them
says what it sent unacknowledged went out (``Hello.went_out``): a next collector without
``state_dir`` then flags it as possibly counted twice, never silently."""


class Collector:
    """The daemon, constructed from a config; ``run()`` blocks until ``stop()`` or a signal.

    ``sinks`` replaces the configured trackers (tests pass in-memory ones); ``wall_clock``
    bounds the producers' ``log()`` times; ``environ`` is where the trackers' environment
    variables are read (``rlpulse.collector.env``).

    >>> # c = Collector(CollectorConfig.load("collector.yaml")); c.run()
    """

    def __init__(
        self,
        config: CollectorConfig,
        *,
        sinks: Mapping[str, Sink] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        environ: Mapping[str, str] = os.environ,
    ) -> None:
        self.config = config
        self._wall_clock = wall_clock
        """Bounds the producers' ``log()`` times (``Aggregator``): records keep this clock's
        time when a rank's clock is ahead."""
        self.health = Health(sinks=self._sink_stats)
        self.health.state_writable = 1
        self._clock = clock
        self._disk_errors = 0
        self._disk_log = RateLimitedLog(log, interval_s=60.0)
        self._loop = LoopClock(clock, self.health, self._disk_log, log)
        """The aggregator's clock (``rlpulse.collector.loopclock``)."""
        self._stop = threading.Event()
        self._reopen = False
        """SIGHUP came: the sinks reopen their files (at the next settle, on the main loop)."""
        self._closed = False
        self._final = False
        self._opened: list[Sink] = []
        self.durable: DurableState | None = None
        self.discovery = Discovery(config.target_policy, self.health)
        self._discovery_due = 0.0
        self._endpoint: Endpoint | None = None
        self._upstream: UpstreamSink | None = None
        """A relay's sink, the collector above."""
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
        if config.state_dir:  # first: it locks state_dir before anything is written there
            self.durable = DurableState(config.state_dir, config)
        relay = None
        if config.upstream is not None:  # a relay: its one sink is the collector above
            relay = relay_id(config.state_dir)
            self._upstream = UpstreamSink(config, relay)
            sinks = {UpstreamSink.name: self._upstream}
        elif sinks is None:
            sinks = {
                name: build_sink(name, kwargs, ctx, environ)
                for name, kwargs in config.trackers.items()
            }
        self.fanout = FanOut(sinks, config, durable=self.durable)
        # Opened only now: an open sink may read the health snapshot (a prometheus scrape),
        # which holds the fan-out's counters (_sink_stats).
        for sink in sinks.values():
            sink.open()
            self._opened.append(sink)
        emit = self.durable.emit if self.durable else self.fanout.put
        self.aggregator = Aggregator(
            emit,
            config,
            output=Relay(relay) if relay is not None else None,
            health=self.health,
            catalog=CATALOG,
            wall_clock=self._wall_clock,
        )
        upstream = sinks.get(UpstreamSink.name)
        if isinstance(upstream, UpstreamSink):  # the verdicts from above reach our producers
            self.aggregator.membership.upstream_late = upstream.member_late
        self.delivery = Delivery(self.health, clock=clock)
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
            self._endpoint.socket,
            self.limits,
            self.health,
            self._endpoint.monitor,
            screen=self.delivery.screen,
        )

    def _sink_stats(self) -> dict[str, dict[str, float]]:
        """Every sink's counters, for the health snapshot: read by a scrape, once the sinks
        are open, so after the fan-out is built."""
        return self.fanout.stats()

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

    def finish(self) -> None:
        """Like :meth:`stop`, for good: no next start will complete the open steps, so they
        are emitted (partial where ranks are missing) and written even with ``state_dir``."""
        self._final = True
        self._stop.set()

    def reopen(self) -> None:
        """Have every sink reopen its files (after a log rotation); safe from signal handlers
        (it only sets a flag: the main loop passes it on within ``POLL_MS``)."""
        self._reopen = True

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())
        signal.signal(signal.SIGUSR1, lambda *_: self.finish())
        signal.signal(signal.SIGHUP, lambda *_: self.reopen())

    def _receive(self, budget: int) -> int:
        """Handle up to ``budget`` waiting messages without blocking; return how many."""
        agg, durable, delivery = self.aggregator, self.durable, self.delivery
        received = self.health.messages_received
        now = self._now()
        for identity, msg, raw in self.receiver.receive(budget):
            for accepted, payload in delivery.accept(msg, identity, raw, agg.admits):
                position = None
                if durable is not None and not isinstance(accepted, protocol.Heartbeat):
                    position = durable.log_input(payload)
                agg.handle(accepted, now, position)
        return int(self.health.messages_received - received)

    def _release(self, now: float) -> None:
        """Apply what held-back producers sent ahead, now that their runs have room."""
        agg, durable = self.aggregator, self.durable
        for accepted, payload in self.delivery.release(agg.has_room, agg.admits):
            position = durable.log_input(payload) if durable is not None else None
            agg.handle(accepted, now, position)

    def _now(self) -> float:
        """The aggregator's clock: it stands still while ``state_dir`` cannot be written,
        and for the main loop's own gaps (``rlpulse.collector.loopclock``)."""
        return self._loop.now()

    def _settle(self) -> None:
        """Emit what is due, make it durable, wake the sinks, then acknowledge; now and then
        publish the registered endpoints for service discovery."""
        if self._reopen:
            self._reopen = False
            log.info("SIGHUP: the sinks reopen their files")
            self.fanout.reopen()
        now = self._now()
        if not self._loop.stalled:
            self.aggregator.poll(now)
            self.delivery.forget(self.aggregator.take_forgotten())
            self._release(now)
        if now >= self._discovery_due:
            self._discovery_due = now + PUBLISH_S
            self.discovery.publish(self.aggregator.membership.scrape_targets(now))
            self.health.scrape_targets = len(self.discovery.targets())
        self.receiver.count_handshake_failures()
        if self.durable is not None and not self._save():
            return  # acknowledgements only ever cover what the write-ahead log holds
        self.receiver.acknowledge(self.delivery.acks(self.aggregator.feedback))

    def _save(self, force_checkpoint: bool = False) -> bool:
        """Write the logs, wake the sinks, checkpoint when due. False while ``state_dir``
        cannot be written (logged and counted; retried by the next call): the caller then
        acknowledges nothing, so producers keep their data and resend it."""
        durable = self.durable
        assert durable is not None
        workers = self.fanout.workers
        try:
            durable.commit()
        except OSError as exc:
            self._state_failed(exc)
            self._count_disk_errors()
            return False
        if self._loop.stalled:
            self._loop.resume(durable.dir)
        self.fanout.notify()
        membership = self.aggregator.membership
        force_checkpoint |= membership.decided  # run attempts are decided once, durably
        try:
            durable.maybe_checkpoint(
                self.aggregator, self.delivery, [w.name for w in workers], force=force_checkpoint
            )
            membership.decided = False
        except OSError as exc:  # the log holds everything: only compaction waits
            self._disk_errors += 1
            self._disk_log.warn(
                "checkpoint",
                f"cannot write the checkpoint in {durable.dir} ({exc.strerror}); retried every "
                f"{durable.checkpoint_s:g}s, old log segments are kept until then",
            )
        self._count_disk_errors()
        return True

    def _count_disk_errors(self) -> None:
        """Failed writes of the main thread and of the sinks' cursors, for ``/metrics``."""
        self.health.disk_errors = self._disk_errors + sum(
            w.reader.write_errors for w in self.fanout.workers if w.reader is not None
        )
        if self._upstream is not None:  # a relay tells the root, in its heartbeats
            self._upstream.report(
                {
                    "disk_errors": int(self.health.disk_errors),
                    "state_unwritable": int(1 - self.health.state_writable),
                }
            )

    def _state_failed(self, exc: OSError) -> None:
        self._disk_errors += 1
        assert self.durable is not None
        self._loop.stall(self.durable.dir, exc, self.durable.unsaved_bytes, RETRY_S)

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
        clock, next_settle, received, busy = self._clock, 0.0, False, False
        self._loop.start()  # start-up (recovery, sinks opening) is no gap of the loop
        flowing = False  # the last window brought messages: sleep through the next, no poll
        try:
            while not self._stop.is_set():
                if self._loop.stalled:
                    self._stop.wait(RETRY_S)  # receive nothing the log could not take
                elif received or flowing:
                    # Data in hand, or data arriving: what arrives before the settle is due
                    # is taken in one go then, not one wake-up per message (the poll and the
                    # wake-up were a third of a paced message's cost). Steps go out no later.
                    delay = next_settle - clock()
                    if delay > 0 and not busy:
                        time.sleep(delay)
                    got = self._receive(BATCH)
                    busy, flowing = got == BATCH, got > 0
                    received = received or flowing
                elif poller.poll(POLL_MS):
                    received = flowing = self._receive(BATCH) > 0
                now = clock()
                if now >= next_settle or not received:
                    self._settle()
                    next_settle, received = now + SETTLE_S, False
        finally:
            self.close()

    def _report_stop(self, abandoned: list[str]) -> None:
        """With ``state_dir``: what this stop left there (``rlpulse.collector.stopreport``)."""
        upstream = self._upstream
        if self.config.state_dir is not None:
            write_stop_report(
                Path(self.config.state_dir),
                final=self._final,
                open_steps=self.aggregator.open_steps(),
                unwritten={w.name: w.backlog() for w in self.fanout.workers if w.backlog()},
                abandoned=abandoned,
                health=self.health,
                upstream_refused=upstream.refused if upstream is not None else None,
            )

    def close(self) -> None:
        """Drain the socket, emit or keep open steps (see the module docstring), close sinks."""
        if self._closed:
            return
        self._closed = True
        while not self._loop.stalled and self._receive(BATCH):
            pass
        self._settle()
        if self.durable is None or self.config.upstream is not None or self._final:
            # In memory only, or the job is over (finish): emit open steps now or lose them.
            # A relay forwards them: the root adds whatever its ranks send for them later, so
            # nothing is made partial.
            self.aggregator.flush()
            if self.durable is not None:
                self._save()
        else:
            open_steps = self.aggregator.open_steps()
            if open_steps:
                log.info(
                    "%d open steps kept in %s; they complete after the next start",
                    open_steps,
                    self.config.state_dir,
                )
            self._save()
        last_acks_at: float | None = None
        if not self._loop.stalled:
            last = self.delivery.acks(self.aggregator.feedback, everything=True, stopping=True)
            self.receiver.acknowledge(last)  # nothing more is applied: the producers know
            if last:
                last_acks_at = time.monotonic()
        self.health.unapplied += self.delivery.unapplied()
        if self.health.unapplied:
            log.warning(
                "%d log() entries from producers that never registered were not applied",
                self.health.unapplied,
            )
        abandoned = self.fanout.close()
        self._report_stop(abandoned)
        if self.durable is not None:
            if not self._save(force_checkpoint=True):
                log.error(
                    "stopping while %s cannot be written: %d bytes of messages and steps are "
                    "not saved; producers were not acknowledged for those messages and resend "
                    "them to the next collector",
                    self.durable.dir,
                    self.durable.unsaved_bytes,
                )
            self.durable.close()
        if self._endpoint is not None:
            if last_acks_at is not None:  # the producers read them before the connection goes
                time.sleep(max(0.0, last_acks_at + LAST_ACKS_S - time.monotonic()))
            self._endpoint.close()
        self._zmq.term()
        upstream = self._upstream
        said = refusals(upstream.refused, upstream.refusal) if upstream is not None else ""
        log_stopped(self.health, abandoned, said)


def write_ready_file(path: str | Path, address: str) -> None:
    """Tell a parent process where we listen: written atomically once the socket is bound."""
    target = Path(path)
    tmp = target.with_suffix(target.suffix + ".tmp")
    tmp.write_text(address + "\n")
    tmp.replace(target)
