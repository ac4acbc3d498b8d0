"""Who a producer is, and who a run is made of: :class:`ProducerInfo` (one registered worker
process, its slot and its watermark) and :class:`Members` (one run's roles, their world sizes
and which producer holds each (role, rank) slot). Registration and liveness, which make and
change them, are in ``rlpulse.collector.runs.membership``.

>>> m = Members(first_seen=0.0)
>>> m.add_role("actor_train", 2)
2
>>> sorted(m.expected())
[('actor_train', 0), ('actor_train', 1)]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from rlpulse.schemas.messages import MAX_STEP, Table, TableDecl

FINISHED = MAX_STEP + 1
"""Watermark of a producer that said goodbye: it has finished every step (beyond any step)."""

Slot = tuple[str, int]


@dataclass
class ProducerInfo:
    """A registered producer (one worker process of one role)."""

    pid: int
    run: str
    role: str
    rank: int
    world_size: int
    host: str
    last_seen: float
    watermark: int = -1
    """Highest step this producer has finished."""
    stats: Mapping[str, int] = field(default_factory=dict)
    tables: dict[int, Table] = field(default_factory=dict)
    """The name tables its (version-2) entries refer to by number."""
    via: int | None = None
    """The relay this producer reached us through (its liveness is the relay's)."""
    presumed_gone: bool = False
    """Its relay presumes it gone (a relay's own liveness verdict)."""
    metrics_url: str = ""
    """The Prometheus endpoint it registered ("" for none)."""
    logs: bool = True
    """False: it registered ``metrics_url`` only and is no rank of its run."""
    resume: bool = False
    """Its hello said it resumes its run (``Hello.resume``); a relay forwards that."""
    asked_run: str = ""
    """The run name its hello gave, when it is recorded under another (a new attempt)."""
    late: int = 0
    """Its entries left out because their step had been emitted (told back in acks)."""
    conflict: int = 0
    """Its entries refused because another process holds its slot (told back in acks)."""
    names_dropped: int = 0
    """Values of its entries left out: names beyond its run's ``max_names_per_run``, or
    computed by the collector (told back in acks; not saved: counted again after a
    restart from what is replayed)."""
    replaced: int | None = None
    """The producer whose slot it took when it registered (withdrawn by its run: ``Run.took_over``)."""
    resumes_after: int | None = None
    """It took its slot from another process, which had finished every step up to this
    one; None once its own first step is known (``Run.resume``), or if it took no
    slot from anyone."""
    ghost: bool = False
    """A producer of a run forgotten since (``Membership.ghosts``): its data is late."""
    aliases: dict[str, str] = field(default_factory=dict)
    """A relay's runs as the relay names them -> as this collector records them."""
    config: bytes = b""
    """The run config its last hello carried (``Hello.config``, as sent: a relay forwards it;
    ``rlpulse.collector.runs.runconfig`` reads it when it changes)."""

    def declare(self, decls: Iterable[TableDecl]) -> None:
        """Take the tables of a hello (validated by the decoder)."""
        for decl in decls:
            known = self.tables.get(decl.id)
            if known is None or known.names != tuple(decl.names) or known.kinds != decl.kinds:
                self.tables[decl.id] = Table.shared(tuple(decl.names), decl.kinds)

    def saved(self) -> list:
        """What a checkpoint keeps of it (``Membership.snapshot``)."""
        return [
            self.run,
            self.role,
            self.rank,
            self.world_size,
            self.host,
            self.watermark,
            self.late,
            self.conflict,
            self.asked_run,
            self.resumes_after,
        ]

    @classmethod
    def from_saved(cls, pid: int, saved: list, now: float) -> ProducerInfo:
        """Back from :meth:`saved` (``resumes_after`` is the caller's: ``Membership.resumes``)."""
        run, role, rank, ws, host, watermark = saved[:6]
        prod = cls(pid, run, role, rank, ws, host, now, watermark)
        if len(saved) > 6:  # saved by a release that reports feedback to producers
            prod.late, prod.conflict, prod.asked_run = saved[6:9]
        return prod

    @property
    def slot(self) -> Slot:
        return (self.role, self.rank)

    @property
    def finished(self) -> bool:
        return self.watermark >= FINISHED


class Members:
    """One run's topology: roles and their world sizes, which producer holds each (role,
    rank) slot, and the bit that marks each role in a merged row (``StepState.roles``)."""

    def __init__(self, first_seen: float, *, local_only: bool = False) -> None:
        self.first_seen = first_seen
        self.roles: dict[str, int] = {}
        self.role_bits: dict[str, int] = {}
        self.slots: dict[Slot, int] = {}
        self.declared = False
        """A producer sent the whole topology: no need to wait for late registrations."""
        self.expected_roles: dict[str, int] = {}
        """That topology, as declared."""
        self.local_only = local_only
        """A relay's view: wait for the ranks registered here, not for the whole topology."""
        self._expected: set[Slot] | None = None

    def expected(self) -> set[Slot]:
        """Every (role, rank) the run waits for; cached until a registration changes roles."""
        if self._expected is None:
            if self.local_only:
                self._expected = {s for s in self.slots if s[1] < self.roles[s[0]]}
            else:
                self._expected = {
                    (role, rank) for role, ws in self.roles.items() for rank in range(ws)
                }
        return self._expected

    def add_role(self, role: str, size: int) -> int:
        """Register a role (the first registration's size wins); return the size kept."""
        kept = self.roles.setdefault(role, size)
        self.role_bits.setdefault(role, len(self.role_bits))
        self._expected = None
        return kept

    def saved(self) -> dict:
        """What a checkpoint keeps of it (``Membership.snapshot``)."""
        return {
            "roles": self.roles,
            "role_bits": self.role_bits,
            "slots": [[role, rank, pid] for (role, rank), pid in self.slots.items()],
            "declared": self.declared,
            "expected_roles": self.expected_roles,
        }

    @classmethod
    def from_saved(cls, data: Mapping, now: float, *, local_only: bool) -> Members:
        run = cls(now, local_only=local_only)
        run.roles = dict(data["roles"])
        run.role_bits = dict(data["role_bits"])
        run.slots = {(role, rank): int(pid) for role, rank, pid in data["slots"]}
        run.declared = bool(data.get("declared", False))
        run.expected_roles = dict(data.get("expected_roles", {}))
        return run

    def settling(self, now: float, settle_s: float) -> bool:
        """A new run whose other roles may still be starting up."""
        return not self.declared and now - self.first_seen < settle_s

    def bits_of(self, owners: str) -> int:
        """The role bits of ``a+b`` role names (a relay's attribution of a row)."""
        bits = 0
        for role in owners.split("+") if owners else ():
            bits |= 1 << self.role_bits.setdefault(role, len(self.role_bits))
        return bits

    def role_names(self, bits: int) -> str:
        """The roles whose bits are set in ``bits``, joined by ``+``."""
        by_bit = {bit: role for role, bit in self.role_bits.items()}
        return "+".join(by_bit[b] for b in sorted(by_bit) if bits >> b & 1)
