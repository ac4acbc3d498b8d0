"""Metrics the collector computes from emitted steps: ``system/tps``, the running totals
(``system/samples``, ``system/tokens``, ``serve/requests_total``, ``serve/errors_total``,
``serve/tokens_generated_total``) and the quantiles of every histogram (``serve/latency/p99``...;
see their catalog help).

``system/tps`` is the tokens of the last ``tps_window`` steps over the wall time they took,
from the end of the step before the window to the end of the newest (a step ends at the
latest ``log()`` of any rank). A running total adds up its sources' values of each step.
A histogram's quantiles are read off the step's bucket counts, which the step has already
merged across ranks (``rlpulse.schemas.histogram``); they need nothing from earlier steps.

>>> t = Throughput(window=1)
>>> m0 = {"system/step_tokens": 100.0}; t.derive(10.0, m0)
>>> m1 = {"system/step_tokens": 300.0}; t.derive(12.0, m1)
>>> m1["system/tps"], m1["system/tokens"]
(150.0, 400.0)
>>> m2 = {"serve/latency/bucket/0.0126": 3.0, "serve/latency/bucket/0.0158": 1.0}
>>> t.derive(13.0, m2); round(m2["serve/latency/p50"], 4)
0.0117
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from rlpulse.schemas import metrics as M
from rlpulse.schemas.histogram import Histogram, quantile
from rlpulse.schemas.reductions import Stat

_TOTALS: tuple[tuple[tuple[str, ...], str], ...] = (
    ((M.SYSTEM_STEP_SAMPLES.name,), M.SYSTEM_SAMPLES.name),
    ((M.SYSTEM_STEP_TOKENS.name,), M.SYSTEM_TOKENS.name),
    ((M.SERVE_REQUESTS.name,), M.SERVE_REQUESTS_TOTAL.name),
    (
        tuple(M.SERVE_ERRORS.format(kind=k) for k in M.SERVE_ERRORS.choices["kind"]),
        M.SERVE_ERRORS_TOTAL.name,
    ),
    ((M.SERVE_TOKENS_GENERATED.name,), M.SERVE_TOKENS_GENERATED_TOTAL.name),
)
"""(sources, total): the total grows by the sum of whichever sources a step has."""


def histogram_quantiles(histogram: Histogram, metrics: Mapping[str, float]) -> dict[str, float]:
    """``histogram``'s quantile entries for a step whose ``metrics`` hold its bucket counts
    (merged across ranks; an absent bucket is empty), clamped to the step's observed min and
    max when it has them. Empty when the step counted no samples.

    >>> histogram_quantiles(M.SERVE_LATENCY, {"serve/latency/bucket/0.5": 0.0})
    {}
    """
    counts = [metrics.get(name, 0.0) for name in histogram.bucket_names]
    if not sum(counts) > 0:
        return {}
    summary = histogram.summary.output_names()
    low, high = metrics.get(summary[Stat.MIN]), metrics.get(summary[Stat.MAX])
    out = {}
    for q, entry in histogram.quantile_entries.items():
        value = quantile(counts, q, histogram.bounds, low=low, high=high)
        if value is not None:
            out[entry.name] = value
    return out


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
        for sources, total in _TOTALS:
            values = [metrics[s] for s in sources if s in metrics]
            if values:
                self.cumulative[total] = self.cumulative.get(total, 0.0) + sum(values)
            if total in self.cumulative:
                metrics[total] = self.cumulative[total]
        for histogram in M.HISTOGRAMS:
            metrics.update(histogram_quantiles(histogram, metrics))

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
