"""``stdout``: a readable block per step, metrics grouped by family.

A family is a name's first part for two-part names (``actor/pg_loss`` is in ``actor``), and
everything but the last part for longer ones (``critic/score/mean`` is in ``critic/score``)::

    step 12  run ppo-demo  8 ranks
      actor                         clipfrac=0.0213  pg_loss=-0.0041
      critic/score                  max=1  mean=0.625  min=0
      time/actor_train/train_step   execute=1.52  total=1.61
      samples rollout/samples  512 rows  best reward=1 actor_train/3 "The answer is 4"  worst reward=-1 actor_train/0 "I think"

A step's samples (``StepRecord.samples``) get one line per name: the rows logged, and the best
and worst row's key value, origin and the start of its main text
(``rlpulse.collector.sinks.samples_view``).

A step with a ledger (``rlpulse.schemas.ledger``) gets it in one line, under the head line, in
place of its ``ledger/...`` numbers (``rlpulse.schemas.ledger_view.line``)::

      step 12 4.10 s = rollout 2.30 (tail 1.10, rollout/0: 60 tokens) + actor_train 1.20 + sync 0.30 + gaps 0.30 | overlap 0.40
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Mapping
from typing import Any, TextIO

from rlpulse.collector.sinks import samples_view
from rlpulse.collector.sinks.base import Sink, SinkContext, reject_unknown
from rlpulse.schemas.errors import ConfigError
from rlpulse.schemas.ledger_view import line as ledger_line
from rlpulse.schemas.record import StepRecord
from rlpulse.schemas.samples import SampleState

_number = samples_view.number
LEDGER = "ledger/"
"""The ledger's numbers, shown as its line instead."""


class StdoutSink(Sink):
    """Prints each step to a text stream (standard output by default).

    >>> import io
    >>> out = io.StringIO()
    >>> sink = StdoutSink(stream=out); sink.open()
    >>> sink.write(StepRecord(run="r", step=1, metrics={"actor/pg_loss": 0.5}, ranks=2))
    >>> "pg_loss=0.5" in out.getvalue()
    True
    """

    name = "stdout"

    def __init__(self, stream: TextIO | None = None, max_per_line: int = 6) -> None:
        self._stream = stream
        self._max_per_line = max_per_line
        self._samples = samples_view.SampleWriter(self.name)

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any], ctx: SinkContext) -> StdoutSink:
        reject_unknown(kwargs, ("max_per_line",), "tracker_kwargs.stdout")
        per_line = kwargs.get("max_per_line", 6)
        if not isinstance(per_line, int) or per_line < 1:
            raise ConfigError(
                "tracker_kwargs.stdout.max_per_line", "must be a positive integer", per_line
            )
        return cls(max_per_line=per_line)

    def open(self) -> None:
        pass

    def format(self, record: StepRecord) -> str:
        head = f"step {record.step}  run {record.run}  {record.ranks} ranks"
        if record.partial:
            head += f"  PARTIAL ({record.why_partial()})"
        lines = [head]
        ledger = ledger_line(record.step, record.metrics, record.ledger)
        if ledger is not None:
            lines.append(f"  {ledger}")
        families: dict[str, list[str]] = defaultdict(list)
        for name in sorted(record.metrics):
            if ledger is not None and name.startswith(LEDGER):
                continue
            family, _, rest = name.rpartition("/") if name.count("/") >= 2 else name.partition("/")
            families[family].append(f"{rest or family}={_number(record.metrics[name])}")
        width = max((len(f) for f in families), default=0)
        for family, items in families.items():
            for i in range(0, len(items), self._max_per_line):
                label = family if i == 0 else ""
                lines.append(f"  {label:<{width}}  " + "  ".join(items[i : i + self._max_per_line]))
        if record.nonfinite:
            dropped = ", ".join(f"{k} x{v}" for k, v in sorted(record.nonfinite.items()))
            lines.append(f"  NaN/Inf samples dropped by producers: {dropped}")

        def line(name: str, state: SampleState) -> None:
            lines.append("  samples " + samples_view.one_line(name, state))

        self._samples.each(record.samples, line)
        return "\n".join(lines) + "\n"

    def write(self, record: StepRecord) -> None:
        stream = self._stream or sys.stdout
        stream.write(self.format(record))
        stream.flush()

    @property
    def samples_failed(self) -> int:
        """Samples lines left out (logged, never raised: the step's numbers were printed)."""
        return self._samples.failed

    def close(self) -> None:
        stream = self._stream or sys.stdout
        stream.flush()
