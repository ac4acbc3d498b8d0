"""A step's samples (``StepRecord.samples``) as the tracker sinks show them: one table per name,
a markdown rendering of it, a one-line best and worst, and a guard so a sink that fails to
write samples still writes the step's numbers.

A table's columns are ``set`` (``top``, ``bottom`` or ``random``), the row's origin ``role``
and ``rank``, then the row's own fields in the order they were first logged (a row without a
field leaves its cell empty). The origin columns read ``origin_role``/``origin_rank`` when the
user's rows have fields of those names. Rows come best first (``top``), worst first
(``bottom``), then the uniform random ones. The texts are already bounded by the producer
(``SampleLimits.field_bytes``); where a sink shows less, :func:`cell` cuts further and says so.

>>> from rlpulse.schemas.samples import SampleLimits, reduce_rows
>>> s = reduce_rows([{"response": "4", "reward": 1.0}, {"response": "5", "reward": 0.0}],
...                 "reward", origin=("actor", 0), limits=SampleLimits(k=1))
>>> t = table(s)
>>> t.columns
('set', 'role', 'rank', 'response', 'reward')
>>> t.rows[:2]
(('top', 'actor', 0, '4', 1.0), ('bottom', 'actor', 0, '5', 0.0))
>>> one_line("rollout/samples", s)
'rollout/samples  2 rows  best reward=1 actor/0 "4"  worst reward=0 actor/0 "5"'
"""

from __future__ import annotations

import html
import logging
from collections.abc import Callable, Mapping
from typing import NamedTuple

from rlpulse.collector.ratelog import RateLimitedLog
from rlpulse.schemas.samples import FieldValue, SampleRow, SampleState

log = logging.getLogger(__name__)

SETS = ("top", "bottom", "random")
"""The sets of a state, in the order the sinks show them."""
PREFIX = "samples/"
"""Trackers show a name's samples under ``samples/<name>``: the name itself is the row count's
scalar (``rollout/samples``), and a tag holds one kind of data."""
TEXT_FIELDS = ("response", "completion", "output", "text", "generation", "answer")
"""Fields that hold a sample's main text, by preference; else the first string field that is
not the prompt, else the prompt."""
MARKDOWN_CELL = 1000
"""Characters of a markdown table cell (TensorBoard): a longer text is cut and says so."""
LINE_TEXT = 60
"""Characters of the main text in a one-line summary (stdout)."""


def tag(name: str) -> str:
    """Where a tracker shows the samples of ``name``."""
    return PREFIX + name


class Table(NamedTuple):
    """A name's kept rows as a table: ``columns`` and one tuple per row (None: no such field)."""

    columns: tuple[str, ...]
    rows: tuple[tuple[FieldValue, ...], ...]


def _sets(state: SampleState) -> list[tuple[str, SampleRow]]:
    return [(s, row) for s in SETS for row in getattr(state, s)]


def table(state: SampleState) -> Table:
    """The rows of ``state`` under the columns ``set``, role, rank, then the rows' fields."""
    tagged = _sets(state)
    fields: dict[str, None] = {}  # first-seen order
    for _, row in tagged:
        fields.update(dict.fromkeys(row.fields))
    role = "origin_role" if "role" in fields else "role"
    rank = "origin_rank" if "rank" in fields else "rank"
    rows = tuple((s, row.role, row.rank, *(row.fields.get(f) for f in fields)) for s, row in tagged)
    return Table(("set", role, rank, *fields), rows)


def number(value: float) -> str:
    """A number as people read it: integral values without a point, others to 4 digits."""
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.4g}"


def text(value: FieldValue) -> str:
    """A cell's value as text (an empty cell for None)."""
    if value is None:
        return ""
    if isinstance(value, float):
        return number(value)
    return str(value)


def shorten(value: str, limit: int) -> str:
    """``value`` in at most ``limit`` characters (and a few for the mark), saying how many
    were left out."""
    if len(value) <= limit:
        return value
    return f"{value[:limit]}…[+{len(value) - limit}]"


def cell(value: FieldValue, limit: int = MARKDOWN_CELL) -> str:
    """A markdown table cell: cut to ``limit`` characters, ``|`` escaped and line breaks shown
    as ``<br>`` (a raw newline would end the table row); ``<``, ``>`` and ``&`` as entities,
    so a response's own tags (``<think>``) show as written."""
    out = html.escape(shorten(text(value), limit), quote=False)
    out = out.replace("\\", "\\\\").replace("|", "\\|")
    return out.replace("\r\n", "<br>").replace("\n", "<br>").replace("\r", "<br>")


def markdown(name: str, state: SampleState, limit: int = MARKDOWN_CELL) -> str:
    """A heading line (rows logged, the key, rows dropped or cut) and the markdown table."""
    t = table(state)
    head = (
        f"**{name}**: {state.rows} rows, ranked by `{state.key}`; top, bottom and random {state.k}"
    )
    if state.dropped or state.cut:
        head += f" ({state.dropped} bad rows dropped, {state.cut} texts cut by producers)"
    lines = [
        head,
        "",
        "| " + " | ".join(cell(c, limit) for c in t.columns) + " |",
        "|" + "---|" * len(t.columns),
    ]
    lines += ["| " + " | ".join(cell(v, limit) for v in row) + " |" for row in t.rows]
    return "\n".join(lines)


def captioned(state: SampleState) -> list[tuple[str, str]]:
    """One ``(caption, text)`` per row, for trackers that show texts with a caption (SwanLab):
    the caption says the set, place, origin and key value (``top 1 · actor/0 · reward=1``),
    the text holds the row's fields one per line (``name: value``)."""
    out = []
    for s in SETS:
        for i, row in enumerate(getattr(state, s), 1):
            caption = f"{s} {i} · {row.role}/{row.rank} · {state.key}={number(row.key)}"
            out.append((caption, "\n".join(f"{f}: {text(v)}" for f, v in row.fields.items())))
    return out


def main_field(state: SampleState) -> str | None:
    """The field holding the sample's main text (see :data:`TEXT_FIELDS`), or None."""
    strings: dict[str, None] = {}
    for _, row in _sets(state):
        strings.update({f: None for f, v in row.fields.items() if isinstance(v, str)})
    for f in TEXT_FIELDS:
        if f in strings:
            return f
    return next((f for f in strings if f != "prompt"), "prompt" if "prompt" in strings else None)


def _brief(row: SampleRow, key: str, field: str | None, limit: int) -> str:
    out = f"{key}={number(row.key)} {row.role}/{row.rank}"
    value = row.fields.get(field) if field is not None else None
    if isinstance(value, str):
        out += ' "' + shorten(" ".join(value.split()), limit) + '"'
    return out


def one_line(name: str, state: SampleState, limit: int = LINE_TEXT) -> str:
    """The name's best and worst row on one line: key value, role/rank, the start of the main
    text (whitespace collapsed)."""
    field = main_field(state)
    out = f"{name}  {state.rows} rows"
    if state.top:
        out += "  best " + _brief(state.top[0], state.key, field, limit)
    if state.bottom:
        out += "  worst " + _brief(state.bottom[0], state.key, field, limit)
    if state.dropped:
        out += f"  ({state.dropped} dropped)"
    return out


class SampleWriter:
    """Runs a sink's samples step name by name, so that one that fails is logged (at most
    once per ``interval_s`` per sink) and counted in ``failed``, never raised: the step's
    numbers, written first, are not retried or lost for it.

    >>> w = SampleWriter("demo")
    >>> w.each({"a": None, "b": None}, lambda name, state: 1 / 0 if name == "a" else None)
    1
    >>> w.failed
    1
    """

    def __init__(self, sink: str, ratelog: RateLimitedLog | None = None) -> None:
        self._sink = sink
        self._ratelog = ratelog or RateLimitedLog(log, interval_s=60.0)
        self.failed = 0

    def each(
        self,
        samples: Mapping[str, SampleState],
        write: Callable[[str, SampleState], None],
    ) -> int:
        """``write(name, state)`` for every name; returns how many failed."""
        failed = 0
        for name, state in samples.items():
            try:
                write(name, state)
            except Exception as exc:  # any library error: the numbers must still go out
                failed += 1
                self._ratelog.warn(
                    "samples", f"sink {self._sink}: samples {name!r} not written ({exc!r})"
                )
        self.failed += failed
        return failed
