"""Build decoded protocol messages directly, as a producer would send them."""

from __future__ import annotations

import array
from collections.abc import Mapping

from rlpulse.schemas import CATALOG, Summary, protocol as P, protocol_v1 as V1


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
