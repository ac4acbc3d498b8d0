"""Per-(run, step) merging across every rank of every role: decoded messages in, finished
steps out, exactly once each.

The Aggregator routes: a hello registers its producer (``rlpulse.collector.runs.membership``) and
a message of a run goes to that run's :class:`~rlpulse.collector.runs.run.Run`, which owns its
members, name table, open steps and the life of its ranks' slots (and where the recovery
rules read). A relay's delta is applied by ``rlpulse.collector.tiers.delta``, the relay protocol's
two ends in one module. At every poll each run says which of its steps are due
(``rlpulse.collector.runs.completion``), and the Aggregator hands each to its
:class:`~rlpulse.collector.output.records.StepOutput`: the collector's makes a
:class:`~rlpulse.schemas.record.StepRecord` for the sinks, a relay's a delta for the collector
above. It also implements the small protocol durable state recovers through
(``rlpulse.collector.durability.durable.Recoverable``).

``log()`` times ahead of the collector's clock are bounded by it (``rlpulse.collector.intake.clock``).

>>> agg = Aggregator(records.append, CollectorConfig(grace_s=30))  # doctest: +SKIP
>>> agg.handle(hello_msg, now); agg.handle(metrics_msg, now); agg.poll(now)  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.health import Health
from rlpulse.collector.intake.clock import ClockBound
from rlpulse.collector.output.records import StepOutput, StepRecords
from rlpulse.collector.ratelog import RateLimitedLog
from rlpulse.collector.runs import completion
from rlpulse.collector.runs.earlier import Earlier
from rlpulse.collector.runs.forgetting import forget_gone, forget_run
from rlpulse.collector.runs.members import FINISHED, ProducerInfo
from rlpulse.collector.runs.membership import Membership
from rlpulse.collector.runs.names import NameTable
from rlpulse.collector.runs.retention import Ended
from rlpulse.collector.runs.run import Run
from rlpulse.collector.runs.runconfig import RunConfigs
from rlpulse.collector.runs.spans import SpanReader
from rlpulse.collector.runs.steps import StepState
from rlpulse.collector.tiers import watch
from rlpulse.collector.tiers.delta import apply_delta
from rlpulse.schemas import protocol
from rlpulse.schemas.catalog import Catalog
from rlpulse.schemas.metrics import CATALOG
from rlpulse.schemas.record import RunForgotten

log = logging.getLogger("rlpulse.collector")


class Aggregator:
    """Routes decoded messages to their runs and hands finished steps to its
    :class:`StepOutput` (default: :class:`StepRecords`, which sends them through ``emit``).

    Time is passed in (``now``, monotonic seconds) so tests drive it without sleeping.
    """

    def __init__(
        self,
        emit: Callable[[Any], None],
        config: CollectorConfig,
        *,
        output: StepOutput | None = None,
        health: Health | None = None,
        catalog: Catalog = CATALOG,
        wall_clock: Callable[[], float] | None = None,
    ) -> None:
        """``wall_clock``: the collector's wall time (``time.time``), which bounds the
        producers' ``log()`` times (``rlpulse.collector.intake.clock``); None trusts them as given."""
        self.emit = emit
        self.config = config
        self.health = health or Health()
        self.earlier = Earlier(self.health) if output is None and not config.state_dir else None
        """Without ``state_dir``: what an earlier instance of this collector may have written,
        as its producers' hellos tell (``rlpulse.collector.runs.earlier``)."""
        self.output: StepOutput = (
            output
            if output is not None
            else StepRecords(
                config.tps_window, self.health, config.ledger_margin, earlier=self.earlier
            )
        )
        self.catalog = catalog
        self.membership = Membership(
            liveness_s=config.liveness_s,
            health=self.health,
            local=self.output.local,
            retention_s=config.run_retention_s,
            relay_dead_s=watch.dead_after(config),
        )
        self.relay_watch = watch.RelayWatch(self.membership, self.health, config)
        """What the relays below are (speaking, silent, presumed dead), said in the log and
        on /metrics."""
        self.runs: dict[str, Run] = {}
        self.configs = RunConfigs(self.health, local=self.output.local)
        """Each run's config, put on its next step (``rlpulse.collector.runs.runconfig``)."""
        self.ended = Ended(config.run_retention_s)
        self.forgotten_pids: list[int] = []
        """Producers forgotten since the daemon last asked (it drops their delivery state)."""
        self._now = 0.0
        """The latest time a poll or a restore was given."""
        self.spans = SpanReader()
        self.clock = ClockBound(wall_clock, self.health) if wall_clock is not None else None
        self._ratelog = RateLimitedLog(log)

    @property
    def producers(self) -> dict[int, ProducerInfo]:
        return self.membership.producers

    def run(self, name: str) -> Run:
        """The run ``name`` (registered in ``membership``), made on first use."""
        run = self.runs.get(name)
        if run is None:
            names = NameTable(
                name,
                catalog=self.catalog,
                health=self.health,
                max_names=self.config.max_names_per_run,
            )
            members = self.membership.runs[name]
            run = self.runs[name] = Run(
                name, members, self.membership, names, self.output, self.spans, self.health
            )
            resumed = self.membership.resumed.pop(name, None)
            if resumed is not None:  # resumed after it was forgotten: its steps went out
                run.last_emitted = resumed
        return run

    def open_steps(self) -> int:
        return sum(len(run.steps) for run in self.runs.values())

    # ------------------------------------------------------------------ messages

    def handle(
        self, msg: protocol.Message, now: float, position: object = None, replay: bool = False
    ) -> None:
        """Apply one decoded message. ``position`` is where it starts in the write-ahead log;
        with ``replay`` (recovery), data for steps already emitted is skipped silently."""
        kind = type(msg)
        if kind is protocol.Hello:
            known = msg.producer in self.membership.producers
            registered = self.membership.register(msg, now)  # type: ignore[arg-type]
            if self.clock is not None and not replay:
                self.clock.sample(registered, msg.sent)  # type: ignore[union-attr]
            if registered.logs and not registered.ghost:
                self.run(registered.run).took_over(registered)
                if self.earlier is not None and not known and not replay:
                    self.earlier.hello(registered, msg)  # type: ignore[arg-type]
            self.configs.hello(registered, msg.config)  # type: ignore[union-attr]
            return
        if kind is protocol.RelayHello:
            self._relay_hello(msg, now)  # type: ignore[arg-type]
            relay = self.membership.relays.get(msg.producer)
            if self.clock is not None and not replay and relay is not None:
                self.clock.sample(relay, msg.sent)  # type: ignore[union-attr]
            return
        prod = self.membership.seen(msg.producer, now)
        if prod is None:
            return
        if prod.ghost:
            self._ghost(prod, msg, replay)
            return
        if not prod.logs:
            self._endpoint_only(prod, msg)
            return
        if kind is protocol.Metrics:
            run = self.run(prod.run)
            # the common case, decided here: the producer holds its slot (no call per message)
            sealing = False if self.membership.holds_slot(prod) else run.sealing(prod, replay)
            if sealing is None:
                run.refuse(prod, len(msg.entries), replay)  # type: ignore[union-attr]
                return
            entries = msg.entries  # type: ignore[union-attr]
            if self.clock is not None:
                entries = self.clock.entries(prod, entries, replay)
            data: protocol.Metrics = msg  # type: ignore[assignment]
            if self.earlier is not None and self.earlier.resending:
                self.earlier.metrics(prod, data, run.last_emitted)
            run.add(
                prod,
                entries,
                data.sketches,
                data.done,
                now,
                position,
                replay,
                sealing,
                data.samples,
            )
            if data.incomplete:
                run.incomplete(prod, data.incomplete, now, position, replay)
        elif kind is protocol.Delta:
            apply_delta(self, prod, msg, now, position, replay)  # type: ignore[arg-type]
        elif isinstance(msg, protocol.Done):
            self.run(prod.run).done(prod, msg.step, now)
            if msg.incomplete:
                self.run(prod.run).incomplete(prod, msg.incomplete, now, position, replay)
        elif isinstance(msg, protocol.Heartbeat):
            self.membership.note_stats(prod, msg.stats)
            if self.clock is not None:
                self.clock.sample(prod, msg.sent)
        elif isinstance(msg, protocol.Bye):
            self.membership.note_stats(prod, msg.stats)
            if msg.incomplete:
                self.run(prod.run).incomplete(prod, msg.incomplete, now, position, replay)
            self.run(prod.run).done(prod, FINISHED, now)

    def _ghost(self, prod: ProducerInfo, msg: protocol.Message, replay: bool) -> None:
        """A message of a producer whose run was forgotten (``runs.retention``): its data is
        late, counted and told back to it; its counters and goodbye are noted."""
        if isinstance(msg, (protocol.Heartbeat, protocol.Bye)):
            self.membership.note_stats(prod, msg.stats)
            if isinstance(msg, protocol.Bye):
                prod.watermark = FINISHED
            return
        entries = len(getattr(msg, "entries", ()))
        if not entries or replay:
            return
        prod.late += entries
        self.health.late += entries
        self._ratelog.warn(
            f"forgotten:{prod.run}",
            f"run {prod.run!r}: producer {prod.pid:x} sent {entries} entries after the run "
            f"ended and was forgotten (run_retention_s={self.config.run_retention_s:g}); "
            "counted late, not merged",
        )

    def _relay_hello(self, msg: protocol.RelayHello, now: float) -> None:
        """A relay's hello: it and the producers behind it register."""
        if self.output.local:  # one tier of relays under the root
            self.health.reject("relay_of_relay")
            self._ratelog.warn(
                "relay_of_relay",
                f"relay {msg.producer:x} on {msg.host} sent its hello to this relay; relays "
                "attach to the root only (its `upstream` should be the root's address)",
            )
            return
        self.membership.register_relay(msg, now)
        for member in msg.members:
            prod = self.membership.producers.get(member.producer)
            if member.logs and prod is not None:
                self.run(prod.run).took_over(prod)
                self.configs.hello(prod, member.config)

    def admits(self, msg: protocol.Message, closing: bool = False) -> bool:
        """Whether ``msg`` may be applied now. A producer's data that would open a step
        while its run already holds ``max_open_steps`` open steps waits (the daemon leaves it
        unacknowledged, and asks for it again once steps were emitted): a producer merely
        ahead of the others (it has finished the oldest open step) is held back instead of
        forcing the oldest steps out partial. A ``closing`` producer (its goodbye has come,
        behind the data held back) is admitted up to the hard bound
        (``completion.HARD_OPEN_FACTOR`` times the window), so its ``close()`` need not wait
        for the others to catch up (``completion.admits``). A relay's delta likewise, when
        every rank behind the relay is ahead (``rlpulse.collector.tiers.watch.admits``)."""
        if type(msg) is protocol.Delta:  # a relay ahead of the others waits as a producer
            return watch.admits(self.membership, self.runs, msg, self.config.max_open_steps)
        if type(msg) is not protocol.Metrics:
            return True
        prod = self.membership.producers.get(msg.producer)
        run = self.runs.get(prod.run) if prod is not None else None
        if prod is None or run is None:
            return True
        window = self.config.max_open_steps
        return completion.admits(run.steps, run.last_emitted, prod, msg.entries, window, closing)

    def has_room(self, pid: int) -> bool:
        """Producer ``pid``, held back, may go on: half its run's ``max_open_steps`` window
        is free again, or it now owes the oldest open step. (Woken at the first free step,
        a producer far ahead resent everything it held for one step's room, and was held
        again: a storm of resends, many times its data, while the others caught up.)"""
        if pid in self.membership.relays:
            return watch.has_room(self.membership, self.runs, pid, self.config.max_open_steps)
        prod = self.membership.producers.get(pid)
        run = self.runs.get(prod.run) if prod is not None else None
        if prod is None or run is None:
            return True
        return completion.has_room(run.steps, prod, self.config.max_open_steps)

    def feedback(self, pid: int) -> tuple[int, int, str, int, list[tuple[int, int]]]:
        """What an acknowledgement tells producer ``pid`` (``Membership.feedback``)."""
        return self.membership.feedback(pid)

    def _endpoint_only(self, prod: ProducerInfo, msg: protocol.Message) -> None:
        """A message of a producer that registered a metrics endpoint only: its counters and
        its goodbye (which unlists the endpoint) apply; data, which it said it would not send,
        is dropped and counted."""
        if isinstance(msg, (protocol.Heartbeat, protocol.Bye)):
            self.membership.note_stats(prod, msg.stats)
            if isinstance(msg, protocol.Bye):
                prod.watermark = FINISHED
            return
        self.health.reject("bad_field")
        self._ratelog.warn(
            f"endpoint-only:{prod.pid}",
            f"{prod.role}/{prod.rank} of run {prod.run!r} registered a metrics endpoint only "
            "(logs=False) yet sent data; dropped",
        )

    # ------------------------------------------------------------------ emitting

    def poll(self, now: float) -> None:
        """Emit every step that is complete, or due to be emitted partial."""
        self.output.before(self, now)
        for run in list(self.runs.values()):
            if not run.steps:
                continue
            for state, missing in run.due(now, self.config):
                self._emit(run, state, missing)
        self.output.after(self, now)
        self.relay_watch.check(self.runs, now)
        self._now = now
        if self.ended.sweep_due(now):
            self._forget_ended(now)

    # ------------------------------------------------------------------ forgetting

    def _forget_ended(self, now: float) -> None:
        """Forget the runs ended for ``run_retention_s``, and the producers of forgotten runs
        that came back and fell silent (``rlpulse.collector.runs.retention``)."""
        membership = self.membership
        ended = {}
        for name in membership.runs:
            run = self.runs.get(name)
            ended[name] = not (run is not None and run.steps) and not membership.live(name, now)
        for name in self.ended.due(ended, now):
            self.forget(name, now)
        self.forgotten_pids += forget_gone(membership, now, self.config.run_retention_s)

    def forget(self, name: str, now: float, emit: bool = True) -> None:
        """Forget the run ``name``: its state here, its producers (a tombstone stays), and,
        with ``emit``, the sinks' state of it (recovery: they were told before the restart)."""
        run = self.runs.pop(name, None)
        last = run.last_emitted if run is not None else -1
        pids = forget_run(self.membership, name, last, now)
        self.configs.forget(name)
        self.output.forget(self, name, pids, self.emit if emit else None)
        if self.clock is not None:
            self.clock.forget(pids)
        self.health.runs_forgotten += 1
        log.info(
            "run %r ended (every rank finished or gone) %gs ago: forgotten (run_retention_s)",
            name,
            self.config.run_retention_s,
        )

    def take_forgotten(self) -> list[int]:
        """The producers forgotten since the last call (the daemon drops their delivery state)."""
        pids, self.forgotten_pids = self.forgotten_pids, []
        return pids

    def flush(self) -> None:
        """Emit every open step now (shutdown): complete ones as usual, the rest partial."""
        for run in list(self.runs.values()):
            run.merger.merge_pending()
            expected = run.members.expected()
            for step in sorted(run.steps):
                state = run.steps[step]
                self._emit(run, state, expected - state.done | state.incomplete)
        self.output.after(self, None)

    def _emit(self, run: Run, state: StepState, missing: set) -> None:
        run.merger.merge_step(state.step)
        run.close(state)
        partial = self.output.finish(run, state, missing, self.configs.attach(run.name, self.emit))
        self.health.steps_emitted += 1
        if partial:
            self.health.partial_steps += 1

    # ------------------------------------------------------------------ durable state

    def oldest_position(self) -> object:
        """The earliest write-ahead-log position an open step still needs, or None."""
        positions = [
            st.position
            for run in self.runs.values()
            for st in run.steps.values()
            if st.position is not None
        ]
        return min(positions) if positions else None  # type: ignore[type-var]

    def note_emitted(self, record: Any) -> None:
        """Recovery: ``record`` (a step record, or a relay's) is in the outbox already; never
        emit that step again, and let the output continue from it."""
        if isinstance(record, RunForgotten):  # forgotten before the restart: again now
            if record.run in self.membership.runs:
                self.forget(record.run, self._now, emit=False)
            return
        run_name, step = getattr(record, "run", ""), getattr(record, "step", -1)
        if run_name and step >= 0:
            self.membership.ensure_run(run_name, 0.0)
            self.run(run_name).emitted_through(step)
        self.configs.emitted(record)
        self.output.note_emitted(self, record)

    def snapshot(self) -> dict:
        """Producers and per-run progress (open steps excluded: they are rebuilt from the log)."""
        out = self.membership.snapshot()
        for name, data in out["runs"].items():
            run = self.runs.get(name)
            if run is not None:
                run.snapshot(data)
            else:
                data["last_emitted"] = -1
        self.output.snapshot(self, out)
        if self.configs.by_run:
            out["configs"] = self.configs.snapshot()
        if self.clock is not None and self.clock.offsets:
            out["clock_offsets"] = self.clock.snapshot()
        return out

    def restore(self, snapshot: Mapping, now: float) -> None:
        self._now = now
        if self.clock is not None:
            self.clock.restore(snapshot.get("clock_offsets", []))
        self.membership.restore(snapshot, now)
        for run in self.runs.values():  # the members restored replace any made before
            run.members = self.membership.runs.get(run.name, run.members)
        for name, data in snapshot.get("runs", {}).items():
            self.run(name).restore(data, now)
        self.output.restore(self, snapshot)
        self.configs.restore(snapshot.get("configs", {}))
