"""The step ledger in the collector: each emitted step's ledger and, for a slow step, its cause.

Per step, at emit time and never per message: the ledger of the step's spans
(``rlpulse.schemas.ledger``, with the step's ``rollout/response/finish/p90`` for rollout
tails) adds its ``ledger/...`` metrics to the record, and each run's previous steps
(``rlpulse.schemas.attribution``) judge whether the step was slow and why. The window of
previous steps is kept in the checkpoint and continued from the outbox after a restart, as the
throughput window is.

>>> from rlpulse.schemas.spans import Span
>>> ledgers = Ledgers(margin=0.2)
>>> metrics = {}
>>> span = Span("reward", 0, "h", "reward", "compute_rewards", 1.0, 2.0, 1.0)
>>> ledgers.add("r", [span], metrics).wall, metrics["ledger/reward"]
(1.0, 1.0)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from rlpulse.schemas.attribution import RollingSteps
from rlpulse.schemas.ledger import StepLedger, compute
from rlpulse.schemas.reductions import Stat
from rlpulse.schemas.rollout import ROLLOUT_RESPONSE_FINISH
from rlpulse.schemas.spans import Span

_P90 = ROLLOUT_RESPONSE_FINISH.output_names()[Stat.P90]
"""Where 90% of the step's responses had finished (merged over engines): rollout tails begin."""


class Ledgers:
    """Every run's rolling window of steps; :meth:`add` makes a step's ledger."""

    def __init__(self, margin: float) -> None:
        self.margin = margin
        self.runs: dict[str, RollingSteps] = {}

    def _run(self, run: str) -> RollingSteps:
        steps = self.runs.get(run)
        if steps is None:
            steps = self.runs[run] = RollingSteps()
        return steps

    def add(self, run: str, spans: Sequence[Span], metrics: dict[str, float]) -> StepLedger | None:
        """The ledger of a step of ``run`` with these ``spans``, its numbers added to the
        step's ``metrics``; None for a step without spans."""
        ledger = compute(spans, metrics.get(_P90))
        if ledger is None:
            return None
        numbers = ledger.metrics()
        judged, cause = self._run(run).judge(numbers, ledger.record, self.margin)
        metrics.update(numbers)
        metrics.update(judged)
        record = ledger.record
        return record if cause is None else msgspec.structs.replace(record, cause=cause)

    def note_emitted(
        self, run: str, metrics: Mapping[str, float], ledger: StepLedger | None
    ) -> None:
        """Recovery: a step of ``run`` already in the outbox joins its window."""
        self._run(run).add(metrics, ledger.runs if ledger is not None else {})

    def snapshot(self, run: str) -> Mapping[str, Any] | list:
        steps = self.runs.get(run)
        return steps.snapshot() if steps is not None else []

    def restore(self, run: str, data: Mapping[str, Any] | Sequence) -> None:
        self._run(run).restore(data)

    def forget(self, run: str) -> None:
        self.runs.pop(run, None)
