"""Build decoded protocol messages directly, as a producer would send them."""

from __future__ import annotations

import array
from collections.abc import Mapping

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.runs.aggregator import Aggregator
from rlpulse.schemas import CATALOG, Summary, protocol as P, protocol_v1 as V1
from rlpulse.schemas.record import StepRecord


def hello(
    pid: int, run: str = "r", role: str = "actor_train", rank: int = 0, ws: int = 1
) -> P.Hello:
    return P.Hello(pid, 1, run, role, rank, ws, "host", 1)


def metrics(
    pid: int, step: int, values: Mapping[str, Summary | float], t: float = 0.0, nonfinite=None
) -> P.Metrics:
    names = list(values)
    rows = array.array("d")
    for v in values.values():
        state = v if isinstance(v, Summary) else Summary.of_scalar(v)
        rows.extend(state)
    kinds = bytes(int(CATALOG.resolve(n).reduction) for n in names)
    raw = V1.pack_entry(step, t, names, kinds, rows.tobytes(), nonfinite)
    return P.decode(V1.encode_metrics(pid, 1, [raw]))  # type: ignore[return-value]


class Harness:
    """An aggregator driven by hand: messages in, emitted records collected, time advanced
    by the test (grace 30 s, liveness 10 s, no settle unless overridden)."""

    def __init__(self, **kwargs) -> None:
        self.records: list[StepRecord] = []
        config = CollectorConfig(**{"grace_s": 30.0, "liveness_s": 10.0, "settle_s": 0.0, **kwargs})
        self.agg = Aggregator(self.records.append, config)
        self.now = 0.0

    def send(self, *msgs: P.Message) -> None:
        for m in msgs:
            self.agg.handle(m, self.now)
        self.agg.poll(self.now)

    def tick(self, seconds: float) -> None:
        self.now += seconds
        self.agg.poll(self.now)

    def steps(self) -> list[int]:
        return [r.step for r in self.records]

    def by_run(self, run: str) -> list[StepRecord]:
        return [r for r in self.records if r.run == run]
