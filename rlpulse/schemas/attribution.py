"""Why a step was slow: its ledger against the run's rolling median step.

A step is *slow* when its wall time (``ledger/wall``) exceeds the median wall time of the
run's previous steps *of its kind* by more than ``margin`` times that median (the collector's
``ledger_margin``, :data:`DEFAULT_MARGIN`), once the run has had :data:`MIN_HISTORY` steps.
A step's kind is which phases it ran and how many times (``StepLedger.runs``): a validation
step, which runs the generation twice, is measured against the last validation steps
(:data:`WINDOW` of each kind), not against the steps between them, which do less; a step of a
kind the run has not had yet is measured against its previous :data:`WINDOW` steps of any
kind, so the phase it added shows as its rise. Its *excess* is its wall time less that
median.

The step's ledger is read as *items*: a bucket of one phase (``straggler`` of
``train_step``, ``work`` of ``generate``, ``sync`` of ``model_update``...), whichever role's
phase was on the path (the critic's training taking the path over from the actor's, which ran
beside it, is no rise), ``gaps`` and ``unaccounted``. Each item's *rise* is its seconds in this
step less its median over the same previous steps (a step without it counts 0). The cause is
the item that rose most, named with the role, rank and phase behind it in this step (the
role's phase with the most of the item's seconds; the slowest rank of a straggler, the engine
of the step's longest response for a rollout tail), if its rise explains at least
:data:`EXPLAINS` of the excess; otherwise the cause is ``mixed``, with the three items that
rose most. Every step, slow or not, then joins the window.

>>> from rlpulse.schemas import ledger as L
>>> steps = RollingSteps()
>>> normal = {L.LEDGER_WALL.name: 2.0, "ledger/path/reward/compute_rewards/execute": 0.1}
>>> for _ in range(3):
...     _ = steps.judge(normal, L.StepLedger(0.0, 2.0), DEFAULT_MARGIN)
>>> slow = {L.LEDGER_WALL.name: 3.0, "ledger/path/reward/compute_rewards/execute": 1.1}
>>> numbers, cause = steps.judge(slow, L.StepLedger(0.0, 3.0, who={"reward:reward/compute_rewards": "reward/0"}), DEFAULT_MARGIN)
>>> numbers["ledger/excess"], cause.label()
(1.0, 'reward reward/0 reward/compute_rewards')
"""

from __future__ import annotations

import statistics
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from typing import Any

from rlpulse.schemas.catalog import Entry
from rlpulse.schemas.ledger import LEDGER_WALL, TAIL, Cause, StepLedger, items
from rlpulse.schemas.reductions import Reduction

DEFAULT_MARGIN = 0.2
"""How much slower than the rolling median a step must be to be given a cause (a fraction of
the median): the default of the collector's ``ledger_margin``."""
WINDOW = 20
"""Previous steps the rolling median is taken over (of each kind, and of any kind)."""
KINDS = 32
"""Kinds of step a run's window keeps (the least recently seen is dropped first)."""
MIN_HISTORY = 3
"""Steps a run must have had before one is judged (the first steps warm up)."""
EXPLAINS = 0.8
"""Share of a slow step's excess one item must explain to be named its cause."""
TOP = 3
"""Items a ``mixed`` cause lists."""

_BY = "Computed by the collector (docs/ledger.md)."
LEDGER_MEDIAN = Entry(
    "ledger/median",
    Reduction.LAST,
    "s",
    f"The median ledger/wall of the run's previous {WINDOW} steps of this step's kind (the "
    f"phases it ran, and how often; of any kind for a kind not seen before), from the run's "
    f"second step on: the step a slow step is measured against. {_BY}",
    derived=True,
)
LEDGER_EXCESS = Entry(
    "ledger/excess",
    Reduction.LAST,
    "s",
    "ledger/wall minus ledger/median: how much slower than the run's rolling median step this "
    f"step was (negative: faster). Above ledger_margin times the median, the record names a "
    f"cause. {_BY}",
    derived=True,
)
ENTRIES = (LEDGER_MEDIAN, LEDGER_EXCESS)


Step = tuple[float, dict[str, float]]
"""A previous step: its wall time and its items pooled by phase (:func:`by_phase`)."""


def kind_of(runs: Mapping[str, int]) -> str:
    """A step's kind as a key: ``cluster/phase*runs`` joined, sorted."""
    return ",".join(f"{phase}*{n}" for phase, n in sorted(runs.items()))


class RollingSteps:
    """One run's previous steps (wall time and ledger items), judging each new one: the last
    :data:`WINDOW` of any kind, and of each of the last :data:`KINDS` kinds."""

    def __init__(self, window: int = WINDOW) -> None:
        self.window = window
        self.steps: deque[Step] = deque(maxlen=window)
        self.kinds: OrderedDict[str, deque[Step]] = OrderedDict()

    def judge(
        self, metrics: Mapping[str, float], ledger: StepLedger, margin: float
    ) -> tuple[dict[str, float], Cause | None]:
        """The step with these ``ledger/...`` ``metrics``: ``ledger/median`` and
        ``ledger/excess`` (from the run's second step), and its cause when it is slow and the
        run has had :data:`MIN_HISTORY` steps (else None). The step then joins the window."""
        wall, detail = metrics[LEDGER_WALL.name], items(metrics)
        mine = by_phase(detail)
        kind = kind_of(ledger.runs)
        out: dict[str, float] = {}
        cause = None
        if self.steps:
            like = self.kinds.get(kind) or self.steps
            median = statistics.median(w for w, _ in like)
            excess = wall - median
            out = {LEDGER_MEDIAN.name: median, LEDGER_EXCESS.name: excess}
            if len(self.steps) >= MIN_HISTORY and excess > margin * median:
                cause = self._cause(like, mine, detail, ledger, excess)
        self._join(kind, (wall, mine))
        return out, cause

    def _join(self, kind: str, step: Step) -> None:
        self.steps.append(step)
        same = self.kinds.pop(kind, None)
        if same is None:
            same = deque(maxlen=self.window)
            if len(self.kinds) >= KINDS:
                self.kinds.popitem(last=False)
        same.append(step)
        self.kinds[kind] = same  # the most recently seen last

    def _cause(
        self,
        like: Sequence[Step],
        mine: Mapping[str, float],
        detail: Mapping[str, float],
        ledger: StepLedger,
        excess: float,
    ) -> Cause:
        keys = set(mine).union(*(its for _, its in like))
        rises = sorted(
            (
                (mine.get(k, 0.0) - statistics.median(its.get(k, 0.0) for _, its in like), k)
                for k in keys
            ),
            reverse=True,
        )
        named = [
            _named(k, rise, rise / excess, detail, ledger) for rise, k in rises[:TOP] if rise > 0
        ]
        if named and named[0].share >= EXPLAINS:
            return named[0]
        return Cause("mixed", seconds=excess, share=1.0, top=named)

    def add(self, metrics: Mapping[str, float], runs: Mapping[str, int]) -> None:
        """Recovery: a step already emitted (its record's metrics and its ledger's ``runs``)
        joins the window."""
        if LEDGER_WALL.name in metrics:
            self._join(kind_of(runs), (metrics[LEDGER_WALL.name], by_phase(items(metrics))))

    def snapshot(self) -> dict[str, Any]:
        return {
            "steps": [[wall, its] for wall, its in self.steps],
            "kinds": [[kind, [[w, its] for w, its in same]] for kind, same in self.kinds.items()],
        }

    def restore(self, data: Mapping[str, Any] | Sequence) -> None:
        """From :meth:`snapshot` (a bare list of steps: a checkpoint from before kinds, its
        steps then of no known kind)."""
        self.steps.clear()
        self.kinds.clear()
        if isinstance(data, Mapping):
            steps, kinds = data["steps"], data["kinds"]
        else:
            steps, kinds = data, []
        for wall, its in steps:
            self.steps.append(_step(wall, its))
        for kind, same in kinds:
            self.kinds[str(kind)] = deque((_step(w, its) for w, its in same), maxlen=self.window)


def _step(wall: Any, its: Mapping[Any, Any]) -> Step:
    return float(wall), {str(k): float(v) for k, v in its.items()}


def by_phase(detail: Mapping[str, float]) -> dict[str, float]:
    """Items (``bucket:cluster/phase``, ``rlpulse.schemas.ledger.items``) pooled by bucket
    and phase, whichever role ran it: ``bucket:phase``."""
    out: dict[str, float] = {}
    for key, seconds in detail.items():
        bucket, _, where = key.partition(":")
        pooled = f"{bucket}:{where.rpartition('/')[2]}" if where else bucket
        out[pooled] = out.get(pooled, 0.0) + seconds
    return out


def _named(
    key: str, rise: float, share: float, detail: Mapping[str, float], ledger: StepLedger
) -> Cause:
    """The item ``key`` (``bucket:phase``) as a cause, with the role's phase behind it in this
    step (the one with the most of its seconds) and who ran it."""
    bucket, _, phase = key.partition(":")
    own = [(s, k) for k, s in detail.items() if k.partition(":")[0] == bucket and phase]
    own = [(s, k) for s, k in own if k.rpartition("/")[2] == phase]
    where = max(own)[1] if own else key
    who = ledger.who.get("longest" if bucket == TAIL else where) or ledger.who.get(where, "")
    role, _, rank = who.rpartition("/")
    return Cause(bucket, role, int(rank) if rank else -1, where.partition(":")[2], rise, share)
