"""Who belongs to each run, and who is still alive: registration and liveness.

Each producer registers with its run, role, rank and world size. The first registration of a
(run, role) fixes how many ranks that role has, so a rank that never showed up is still
waited for. A producer may also declare the run's whole topology (``expected_roles``): then
roles that have not registered yet are waited for by name instead of by the ``settle_s``
window. A producer silent for ``liveness_s`` is presumed dead; so is a slot nobody registered
within ``liveness_s`` of the run's first registration.

A producer may register a Prometheus endpoint its process serves (``metrics_url``), listed for
service discovery while it is alive (:meth:`Membership.scrape_targets`). One that only
registers an endpoint (``logs`` false) is kept apart, in ``endpoints``: it is no rank of its run.

>>> m = Membership(liveness_s=10.0, health=Health())
>>> prod = m.register(protocol.Hello(1, 1, "r", "actor_train", 0, 2, "host", 1), now=0.0)
>>> sorted(m.runs["r"].expected())
[('actor_train', 0), ('actor_train', 1)]
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from rlpulse.collector.health import Health
from rlpulse.collector.output.discovery import ScrapeTarget
from rlpulse.collector.ratelog import RateLimitedLog
from rlpulse.collector.runs.members import FINISHED, Members, ProducerInfo, Slot
from rlpulse.collector.runs.retention import Tombstones
from rlpulse.schemas import protocol
from rlpulse.schemas.messages import TableDecl

log = logging.getLogger("rlpulse.collector")


class Membership:
    """Every producer and every run's :class:`Members`.

    Run identity: a run is named by its producers. A hello naming a run that is still live
    here (a rank not finished and not presumed gone, or a slot still waited for) joins it. A
    hello naming a run that has *ended* here (every slot finished or presumed gone) starts a
    new attempt, recorded as ``name-2`` (``name-3``...), said in a warning, counted
    (``run_attempts``) and told to the producer in its acknowledgement, unless the producer
    says it resumes (``Hello.resume``): then it continues the run, and whatever it sends for
    steps already emitted is late, counted and told back.

    ``local`` (a relay's membership): a run waits for the ranks registered here only, not the
    whole topology, and run attempts are not decided here: the name is forwarded and the
    collector above decides.
    """

    def __init__(
        self,
        *,
        liveness_s: float,
        health: Health,
        local: bool = False,
        retention_s: float = 3600.0,
        relay_dead_s: float | None = None,
    ) -> None:
        self.liveness_s = liveness_s
        self.relay_dead_s = liveness_s if relay_dead_s is None else relay_dead_s
        """A relay below silent this long: its ranks are gone (``tiers.watch.dead_after``)."""
        self.health = health
        self.local = local
        self.attempts = not local
        self.current: dict[str, str] = {}
        """A run name producers give -> its latest attempt here, when that is another name."""
        self.decided = False
        """A new attempt was started, or an ended run resumed, since the daemon last saved
        the checkpoint: it saves one now, so recovery never decides it again at another time
        (the daemon clears this)."""
        self.producers: dict[int, ProducerInfo] = {}
        self.relays: dict[int, ProducerInfo] = {}
        """Relays below this collector, by their producer id."""
        self.relay_late: dict[int, dict[int, int]] = {}
        """Per relay below, its members' entries left out here as late (cumulative), told to
        the relay in its acks so it tells each producer."""
        self.upstream_late: Mapping[int, int] = {}
        """A relay's: per producer, its entries the collector above left out as late, as the
        acks from above say (written by the upstream sink's thread)."""
        self.endpoints: dict[int, ProducerInfo] = {}
        """Producers that only register a metrics endpoint (``logs`` false), by id."""
        self._scraped: dict[int, ProducerInfo] = {}
        """Every producer, of either kind, that registered a metrics endpoint."""
        self.runs: dict[str, Members] = {}
        self.tombstones = Tombstones(retention_s)
        """Runs forgotten ``retention_s`` after they ended (``rlpulse.collector.runs.retention``)."""
        self.ghosts: dict[int, ProducerInfo] = {}
        """Producers of forgotten runs that came back: all they send is late."""
        self.resumed: dict[str, int] = {}
        """Forgotten runs a producer resumed, with their last emitted step (for their new
        ``Run``, which the aggregator makes and takes it from here)."""
        self.resuming: set[int] = set()
        """Producers whose ``resumes_after`` is set: relayed entries are checked for them
        only while there are any."""
        self._ratelog = RateLimitedLog(log)

    def resumes(self, prod: ProducerInfo, after: int | None) -> None:
        """Set ``prod.resumes_after`` (None: its first step is known, or it took no slot)."""
        prod.resumes_after = after
        if after is None:
            self.resuming.discard(prod.pid)
        else:
            self.resuming.add(prod.pid)

    def register(self, msg: protocol.Hello, now: float) -> ProducerInfo:
        """Apply a hello; a producer already known is only marked alive (and takes the
        endpoint it says, a collector restarted without saved endpoints learning it again)."""
        prod = self.producers.get(msg.producer)
        if prod is None:
            ghost = self._ghost(msg.producer, now)
            if ghost is not None:
                return ghost
        if prod is None and not msg.logs:
            return self._register_endpoint(msg, now)
        if prod is not None:
            prod.last_seen = now
            prod.declare(msg.tables)
            self._note_endpoint(prod, msg.metrics_url)
            return prod
        name = self._attempt(msg, now)
        run = self.runs.get(name)
        if run is None:
            run = self.runs[name] = Members(now, local_only=self.local)
        for role, size in msg.expected.items():
            run.declared = True
            run.expected_roles.setdefault(role, size)
            run.add_role(role, size)
        ws = run.add_role(msg.role, msg.world_size)
        if msg.world_size != ws:
            self.health.world_size_conflict += 1
            self._ratelog.warn(
                f"ws:{name}:{msg.role}",
                f"run {name!r} role {msg.role!r}: rank {msg.rank} says world size "
                f"{msg.world_size}, the first registration said {ws}; keeping {ws}",
            )
        prod = ProducerInfo(msg.producer, name, msg.role, msg.rank, msg.world_size, msg.host, now)
        prod.resume = msg.resume
        if name != msg.run:
            prod.asked_run = msg.run
        prod.declare(msg.tables)
        self.producers[msg.producer] = prod
        self._note_endpoint(prod, msg.metrics_url)
        previous = run.slots.get(prod.slot)
        run.slots[prod.slot] = prod.pid
        run._expected = None  # a relay's expected ranks are the registered ones
        if previous is not None and previous != prod.pid:
            prod.replaced = previous
            self._took_over(name, prod, self.producers.get(previous), now)
        else:
            log.info(
                "run %r: %s/%d of %d registered (host %s)", name, msg.role, msg.rank, ws, msg.host
            )
        self.health.producers = len(self.producers)
        return prod

    def _took_over(
        self, name: str, prod: ProducerInfo, old: ProducerInfo | None, now: float
    ) -> None:
        """``prod`` took the slot of ``old``: a restarted rank, or two processes claiming one
        rank (``old`` still alive). Counted and warned about; the aggregator withdraws what
        ``old`` gave to steps not yet emitted, and refuses its further entries."""
        self.health.rank_takeovers += 1
        alive = old is not None and not old.finished and not self.silent(old, now)
        what = (
            f"another live process ({old.host}, producer {old.pid:x}) still claims it: check "
            "the job's rank assignment; only the newest is counted"
            if alive and old is not None
            else "the previous process is gone or finished (a restart)"
        )
        self._ratelog.warn(
            f"takeover:{name}:{prod.role}:{prod.rank}",
            f"run {name!r}: {prod.role}/{prod.rank} registered from a new process (host "
            f"{prod.host}, producer {prod.pid:x}); {what}. The previous process's data for "
            "steps not yet emitted is withdrawn",
        )

    def _attempt(self, msg: protocol.Hello, now: float) -> str:
        """The run a new producer's hello joins: the latest attempt of the name it gives,
        unless that attempt has ended here and the producer does not resume (then a new
        attempt, ``name-2``...)."""
        asked = msg.run
        name = self.current.get(asked, asked)
        run = self.runs.get(name)
        forgotten = run is None and self.tombstones.last_emitted(name) is not None
        if forgotten and (msg.resume or not self.attempts):  # it goes on, as a new run here
            self.decided = True
            self.resumed[name] = self.tombstones.pop(name)  # type: ignore[assignment]
            return name
        # A run with no role yet is a placeholder (recovery made it for a step it had
        # emitted, before the log gave back its registrations): nothing there has ended.
        if not forgotten and (
            not self.attempts or run is None or not run.roles or self.live(name, now)
        ):
            return name
        self.decided = True
        if run is not None and msg.resume:  # a restarted job: its ranks hold the slots afresh
            run.slots.clear()
            run.first_seen = now
            run._expected = None
            log.info("run %r resumed by %s/%d", name, msg.role, msg.rank)
            return name
        k = 2
        while (
            f"{asked}-{k}" in self.runs or self.tombstones.last_emitted(f"{asked}-{k}") is not None
        ):
            k += 1
        fresh = self.current[asked] = f"{asked}-{k}"
        self.health.run_attempts += 1
        log.warning(
            "run %r had ended here (every rank finished or gone); %s/%d starts a new attempt, "
            "recorded as %r (a producer made with resume=True, or RLPULSE_RESUME=1, continues "
            "%r instead)",
            name,
            msg.role,
            msg.rank,
            fresh,
            name,
        )
        return fresh

    def live(self, name: str, now: float) -> bool:
        """A slot of the run is still waited for: its producer neither finished nor presumed
        gone, or nobody registered it yet and the run is younger than ``liveness_s``."""
        run = self.runs[name]
        for slot in run.expected():
            pid = run.slots.get(slot)
            if pid is None:
                if now - run.first_seen < self.liveness_s:
                    return True
                continue
            prod = self.producers[pid]
            if not prod.finished and not self.silent(prod, now):
                return True
        return False

    def _ghost(self, pid: int, now: float) -> ProducerInfo | None:
        """A producer of a forgotten run (a tombstone names it) heard from again: kept
        apart, in ``ghosts``, and all it sends is late (``Aggregator``); None for others."""
        prod = self.ghosts.get(pid)
        if prod is None:
            run = self.tombstones.run_of(pid)
            if run is None:
                return None
            prod = self.ghosts[pid] = ProducerInfo(pid, run, "", -1, 1, "", now, FINISHED)
            prod.ghost = True
            prod.late = self.tombstones.late.get(pid, 0)
            log.warning(
                "run %r: producer %x was heard from after its run ended and was forgotten "
                "(run_retention_s); what it sends is counted late",
                run,
                pid,
            )
        prod.last_seen = now
        return prod

    def _register_endpoint(self, msg: protocol.Hello, now: float) -> ProducerInfo:
        """A producer that registers its metrics endpoint only: kept for discovery and
        liveness, never a slot of its run."""
        prod = self.endpoints.get(msg.producer)
        if prod is None:
            prod = self.endpoints[msg.producer] = ProducerInfo(
                msg.producer, msg.run, msg.role, msg.rank, msg.world_size, msg.host, now
            )
            prod.logs = False
            log.info(
                "run %r: %s/%d registered the metrics endpoint %s (host %s)",
                msg.run,
                msg.role,
                msg.rank,
                msg.metrics_url,
                msg.host,
            )
        prod.last_seen = now
        self._note_endpoint(prod, msg.metrics_url)
        return prod

    def _note_endpoint(self, prod: ProducerInfo, url: str) -> None:
        prod.metrics_url = url
        if url:
            self._scraped[prod.pid] = prod
        else:
            self._scraped.pop(prod.pid, None)

    def scrape_targets(self, now: float) -> list[ScrapeTarget]:
        """The registered endpoints to scrape now: of producers not finished, not presumed
        gone, and (ranks) still holding their slot, not replaced by a newer process."""
        out = []
        for prod in self._scraped.values():
            if prod.finished or self.silent(prod, now):
                continue
            if prod.logs and not self.holds_slot(prod):
                continue
            out.append(ScrapeTarget(prod.metrics_url, prod.run, prod.role, prod.rank, prod.host))
        return out

    def register_relay(self, msg: protocol.RelayHello, now: float) -> ProducerInfo:
        """Apply a relay's hello: the relay itself (a producer of no run, whose tables its
        deltas use) and the producers behind it, registered as if they had said hello."""
        relay = self.relays.get(msg.producer)
        if relay is None:
            relay = self.relays[msg.producer] = ProducerInfo(
                msg.producer, "", "relay", 0, 1, msg.host, now
            )
            log.info("relay %x registered (host %s)", msg.producer, msg.host)
        relay.last_seen = now
        relay.declare(msg.tables)
        for m in msg.members:
            hello = protocol.Hello(
                m.producer,
                0,
                m.run,
                m.role,
                m.rank,
                m.world_size,
                m.host,
                0,
                m.expected,
                metrics_url=m.metrics_url,
                logs=m.logs,
                resume=m.resume,
            )
            prod = self.register(hello, now)
            prod.via = msg.producer
            prod.presumed_gone = m.gone
            if prod.logs:
                relay.aliases[m.run] = prod.run
        return relay

    def seen(self, pid: int, now: float) -> ProducerInfo | None:
        """The producer of a message, marked alive; None (counted) if it never registered."""
        prod = (
            self.producers.get(pid)
            or self.relays.get(pid)
            or self.endpoints.get(pid)
            or self._ghost(pid, now)
        )
        if prod is None:
            self.health.unknown_producer += 1
            return None
        prod.last_seen = now
        return prod

    def feedback(self, pid: int) -> tuple[int, int, str, int, list[tuple[int, int]]]:
        """What an acknowledgement tells producer ``pid`` beyond the sequence number: its
        entries left out as late (here, and by the collector above a relay) and as
        conflicts, the run it is recorded under when that is not the name it gave (""
        otherwise), its values of names left out; to a relay, its members' late entries."""
        prod = self.producers.get(pid) or self.ghosts.get(pid)
        if prod is None:
            told = self.relay_late.get(pid)
            return 0, 0, "", 0, list(told.items()) if told else []
        late = prod.late + self.upstream_late.get(pid, 0)
        run = prod.run if prod.asked_run else ""
        return late, prod.conflict, run, prod.names_dropped, []

    def note_stats(self, prod: ProducerInfo, stats: Mapping[str, int]) -> None:
        prod.stats = stats
        self.health.producer_stats[prod.pid] = stats

    def holds_slot(self, prod: ProducerInfo) -> bool:
        """Whether ``prod`` is the producer its run counts for its (role, rank): not replaced
        by a newer process, and within the role's world size."""
        run = self.runs[prod.run]
        return run.slots.get(prod.slot) == prod.pid and prod.rank < run.roles[prod.role]

    def replaced(self, prod: ProducerInfo) -> bool:
        """Whether another process has taken ``prod``'s slot (one within the world size)."""
        run = self.runs[prod.run]
        holder = run.slots.get(prod.slot)
        return holder is not None and holder != prod.pid and prod.rank < run.roles[prod.role]

    def gone(self, run_name: str, slot: Slot, now: float) -> bool:
        """The slot's producer fell silent, or nobody registered for it in time."""
        run = self.runs[run_name]
        pid = run.slots.get(slot)
        if pid is None:
            return now - run.first_seen >= self.liveness_s
        prod = self.producers[pid]
        return not prod.finished and self.silent(prod, now)

    def silent(self, prod: ProducerInfo, now: float) -> bool:
        """``prod`` is presumed dead: silent for ``liveness_s``; behind a relay, the relay's
        verdict, or the relay silent for ``relay_dead_s`` (a relay's silence alone says
        nothing of its ranks: ``rlpulse.collector.tiers.watch``)."""
        if prod.via is not None:
            relay = self.relays.get(prod.via)
            return prod.presumed_gone or relay is None or now - relay.last_seen >= self.relay_dead_s
        return now - prod.last_seen >= self.liveness_s

    def finished_slots(self, run_name: str, step: int) -> set[Slot]:
        """Slots whose producer has already finished ``step`` (for a step opened late)."""
        run = self.runs[run_name]
        return {
            slot
            for slot, pid in run.slots.items()
            if self.producers[pid].watermark >= step and slot[1] < run.roles[slot[0]]
        }

    # ------------------------------------------------------------------ durable state

    def snapshot(self) -> dict:
        return {
            "producers": {str(p.pid): p.saved() for p in self.producers.values()},
            "current": dict(self.current),
            "aliases": {str(r.pid): r.aliases for r in self.relays.values() if r.aliases},
            "tables": {
                str(p.pid): [[i, list(t.names), list(t.kinds)] for i, t in p.tables.items()]
                for p in (*self.producers.values(), *self.relays.values())
                if p.tables
            },
            "relays": {str(r.pid): r.host for r in self.relays.values()},
            "via": {
                str(p.pid): [p.via, p.presumed_gone]
                for p in self.producers.values()
                if p.via is not None
            },
            "runs": {name: run.saved() for name, run in self.runs.items()},
            **({"forgotten": self.tombstones.snapshot()} if len(self.tombstones) else {}),
        }

    def restore(self, snapshot: Mapping, now: float) -> None:
        for pid, saved in snapshot.get("producers", {}).items():
            prod = self.producers[int(pid)] = ProducerInfo.from_saved(int(pid), saved, now)
            if len(saved) > 9:  # saved by a release that tells skipped steps apart
                self.resumes(prod, saved[9])
        self.current.update(snapshot.get("current", {}))
        for pid, host in snapshot.get("relays", {}).items():
            self.relays[int(pid)] = ProducerInfo(int(pid), "", "relay", 0, 1, host, now)
        for pid, aliases in snapshot.get("aliases", {}).items():
            self.relays[int(pid)].aliases.update(aliases)
        for pid, (via, presumed_gone) in snapshot.get("via", {}).items():
            self.producers[int(pid)].via = via
            self.producers[int(pid)].presumed_gone = presumed_gone
        for pid, tables in snapshot.get("tables", {}).items():
            (self.producers.get(int(pid)) or self.relays[int(pid)]).declare(
                TableDecl(i, names, bytes(kinds)) for i, names, kinds in tables
            )
        for name, data in snapshot.get("runs", {}).items():
            self.runs[name] = Members.from_saved(data, now, local_only=self.local)
        self.tombstones.restore(snapshot.get("forgotten", []), now)
        self.health.producers = len(self.producers)

    def unlist(self, pid: int) -> None:
        """Producer ``pid`` is forgotten: its endpoint is no longer listed for discovery."""
        self._scraped.pop(pid, None)

    def ensure_run(self, name: str, now: float) -> Members:
        """The run's members, created empty if unknown (recovery of an emitted step)."""
        run = self.runs.get(name)
        if run is None:
            run = self.runs[name] = Members(now, local_only=self.local)
        return run
