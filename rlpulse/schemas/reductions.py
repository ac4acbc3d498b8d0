"""How a metric's samples merge across calls and ranks, and which statistics it reports.

A *reduction* says how two partial states combine (and so how every rank's data pools into one
global value). A *statistic* is one number read off the merged state. A family such as
``critic/advantages`` has one reduction (a weighted mean) and three statistics (mean, max, min).
"""

from __future__ import annotations

import enum


class Reduction(enum.IntEnum):
    """The merge rule of a metric; the integer value is its code on the wire."""

    MEAN = 1
    """Pooled weighted mean: sum of values over sum of weights (tokens, samples)."""
    FRACTION = 2
    """Numerator over denominator, each summed across ranks (clip fractions, ratios)."""
    SUM = 3
    """Total across calls and ranks (counts)."""
    MAX = 4
    """Largest value across calls and ranks (phase times, memory peaks)."""
    MIN = 5
    """Smallest value across calls and ranks."""
    LAST = 6
    """The most recent value (a learning rate that every rank shares)."""
    DIST = 7
    """A distribution: the pooled mean, max and min of ``MEAN``, plus a quantile sketch
    (``rlpulse.schemas.sketch``) merged by adding counts. Producers send the state row as
    ``MEAN`` on the wire (an older collector reads it as before); the sketch rides beside."""

    @classmethod
    def parse(cls, value: str | int | Reduction) -> Reduction:
        """Accept ``"max"``, ``Reduction.MAX`` or the wire code 4."""
        if isinstance(value, Reduction):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return cls(value)
        if isinstance(value, str) and value.upper() in cls.__members__:
            return cls[value.upper()]
        names = ", ".join(m.name.lower() for m in cls)
        raise ValueError(f"unknown reduction {value!r}: expected one of {names}")


class Stat(enum.Enum):
    """A number read off a merged state."""

    MEAN = "mean"
    FRACTION = "fraction"
    SUM = "sum"
    MAX = "max"
    MIN = "min"
    LAST = "last"
    P50 = "p50"
    P90 = "p90"
    P99 = "p99"


QUANTILE_STATS: dict[Stat, float] = {Stat.P50: 0.5, Stat.P90: 0.9, Stat.P99: 0.99}
"""The quantile each quantile statistic reads off a distribution's sketch."""


# The statistic a single-output metric reports for each reduction.
DEFAULT_STAT: dict[Reduction, Stat] = {
    Reduction.MEAN: Stat.MEAN,
    Reduction.FRACTION: Stat.FRACTION,
    Reduction.SUM: Stat.SUM,
    Reduction.MAX: Stat.MAX,
    Reduction.MIN: Stat.MIN,
    Reduction.LAST: Stat.LAST,
    Reduction.DIST: Stat.MEAN,
}

# The reduction that a single statistic, logged on its own under its output name, merges by.
# A quantile logged on its own (pre-computed by a framework) cannot merge: it keeps the largest.
STAT_REDUCTION: dict[Stat, Reduction] = {
    **{stat: red for red, stat in DEFAULT_STAT.items() if red is not Reduction.DIST},
    **dict.fromkeys(QUANTILE_STATS, Reduction.MAX),
}
