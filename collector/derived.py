"""Metrics the collector computes from emitted steps: ``system/tps``, ``system/samples`` and
``system/tokens`` (see their catalog help).

``system/tps`` is the tokens of the last ``tps_window`` steps over the wall time they took,
from the end of the step before the window to the end of the newest (a step ends at the
latest ``log()`` of any rank). The cumulative totals add up each step's
``system/step_samples`` and ``system/step_tokens``.

>>> t = Throughput(window=1)
>>> m0 = {"system/step_tokens": 100.0}; t.derive(10.0, m0)
>>> m1 = {"system/step_tokens": 300.0}; t.derive(12.0, m1)
>>> m1["system/tps"], m1["system/tokens"]
(150.0, 400.0)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from schemas import metrics as M

_TOTALS = (
    (M.SYSTEM_STEP_SAMPLES.name, M.SYSTEM_SAMPLES.name),
    (M.SYSTEM_STEP_TOKENS.name, M.SYSTEM_TOKENS.name),
)


class Throughput:
    """One run's throughput window and cumulative totals."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.ends: deque[tuple[float, float | None]] = deque()
        """(end time, step tokens) of the last ``window + 1`` steps."""
        self.cumulative: dict[str, float] = {}

    def _remember(self, end: float, tokens: float | None) -> None:
        self.ends.append((end, tokens))
        while len(self.ends) > self.window + 1:
            self.ends.popleft()

    def derive(self, end: float, metrics: dict[str, float]) -> None:
        """Add the derived metrics of a step ending at ``end`` to its ``metrics``."""
        self._remember(end, metrics.get(M.SYSTEM_STEP_TOKENS.name))
        window = list(self.ends)[1:]
        if len(self.ends) >= 2 and all(tok is not None for _, tok in window):
            elapsed = self.ends[-1][0] - self.ends[0][0]
            if elapsed > 0:
                metrics[M.SYSTEM_TPS.name] = (
                    sum(tok for _, tok in window if tok is not None) / elapsed
                )
        for source, total in _TOTALS:
            value = metrics.get(source)
            if value is not None:
                self.cumulative[total] = self.cumulative.get(total, 0.0) + value
            if total in self.cumulative:
                metrics[total] = self.cumulative[total]

    def resume(self, end: float, metrics: Mapping[str, float]) -> None:
        """Recovery: a step already emitted (in the outbox) continues the window and totals."""
        self._remember(end, metrics.get(M.SYSTEM_STEP_TOKENS.name))
        for _, total in _TOTALS:
            if total in metrics:
                self.cumulative[total] = metrics[total]

    def snapshot(self) -> dict:
        return {"ends": list(self.ends), "cumulative": self.cumulative}

    def restore(self, data: Mapping) -> None:
        self.ends = deque((float(t), tok) for t, tok in data["ends"])
        self.cumulative = dict(data["cumulative"])
