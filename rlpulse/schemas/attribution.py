"""Why a step was slow: its ledger against the run's rolling median step.

A step is *slow* when its wall time (``ledger/wall``) exceeds the median wall time of the
run's previous :data:`WINDOW` steps (once there are :data:`MIN_HISTORY`) by more than
``margin`` times that median (the collector's ``ledger_margin``, :data:`DEFAULT_MARGIN`). Its
*excess* is its wall time less that median.

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
from collections import deque
from collections.abc import Mapping, Sequence

from rlpulse.schemas.catalog import Entry
from rlpulse.schemas.ledger import LEDGER_WALL, TAIL, Cause, StepLedger, items
from rlpulse.schemas.reductions import Reduction

DEFAULT_MARGIN = 0.2
"""How much slower than the rolling median a step must be to be given a cause (a fraction of
the median): the default of the collector's ``ledger_margin``."""
WINDOW = 20
"""Previous steps the rolling median is taken over."""
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
    f"The median ledger/wall of the run's previous {WINDOW} steps (from its second step on): "
    f"the step a slow step is measured against. {_BY}",
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


class RollingSteps:
    """One run's previous steps (wall time and ledger items), judging each new one."""

    def __init__(self, window: int = WINDOW) -> None:
        self.steps: deque[tuple[float, dict[str, float]]] = deque(maxlen=window)

    def judge(
        self, metrics: Mapping[str, float], ledger: StepLedger, margin: float
    ) -> tuple[dict[str, float], Cause | None]:
        """The step with these ``ledger/...`` ``metrics``: ``ledger/median`` and
        ``ledger/excess`` (from the run's second step), and its cause when it is slow and the
        run has had :data:`MIN_HISTORY` steps (else None). The step then joins the window."""
        wall, detail = metrics[LEDGER_WALL.name], items(metrics)
        mine = by_phase(detail)
        out: dict[str, float] = {}
        cause = None
        if self.steps:
            median = statistics.median(w for w, _ in self.steps)
            excess = wall - median
            out = {LEDGER_MEDIAN.name: median, LEDGER_EXCESS.name: excess}
            if len(self.steps) >= MIN_HISTORY and excess > margin * median:
                cause = self._cause(mine, detail, ledger, excess)
        self.steps.append((wall, mine))
        return out, cause

    def _cause(
        self,
        mine: Mapping[str, float],
        detail: Mapping[str, float],
        ledger: StepLedger,
        excess: float,
    ) -> Cause:
        keys = set(mine).union(*(its for _, its in self.steps))
        rises = sorted(
            (
                (mine.get(k, 0.0) - statistics.median(its.get(k, 0.0) for _, its in self.steps), k)
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

    def add(self, metrics: Mapping[str, float]) -> None:
        """Recovery: a step already emitted (its record's metrics) joins the window."""
        if LEDGER_WALL.name in metrics:
            self.steps.append((metrics[LEDGER_WALL.name], by_phase(items(metrics))))

    def snapshot(self) -> list:
        return [[wall, its] for wall, its in self.steps]

    def restore(self, data: Sequence) -> None:
        self.steps.clear()
        for wall, its in data:
            self.steps.append((float(wall), {str(k): float(v) for k, v in its.items()}))


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
