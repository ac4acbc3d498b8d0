"""``rlpulse samples``: the generations behind a run's numbers (prompt, response, reward...),
read back from its jsonl file and printed for a terminal; and ``compare --samples``, two runs'
samples at one step next to each other.

::

    rlpulse samples RUN.jsonl [--run NAME] [--step N] [--name NAME] [--top|--bottom|--random]
                    [--width W] [--lines L] [--json]
    rlpulse compare A.jsonl B.jsonl --samples STEP [--name NAME] [--width W] [--lines L]

A step's JSON line carries its samples under ``"samples"``, one entry per logged name, each
exactly :meth:`rlpulse.schemas.samples.SampleState.record`: the ``key`` the rows are ranked by;
the ``top``, ``bottom`` and ``random`` rows (each row the logged dict plus the ``role`` and
``rank`` that logged it); ``rows`` reduced, ``dropped`` as bad and text fields ``cut``.

The run reader (:mod:`rlpulse.runtools.runs`) keeps only the metrics of a line, so the records
are read here, with its rules: several runs in a file are told apart by name, and a step
written twice counts once, the later line winning.

Layout of ``compare --samples``: side by side, one column per run, the i-th row of each run's
set on one band, because the question asked of two runs is "is A's best (worst, typical) answer
better than B's", which the eye answers by looking across. A column narrower than
:data:`MIN_COLUMN` wraps a response to a few words a line, which reads worse than no layout at
all, so a terminal too narrow for every run's column gets each set one run after the other
instead, under the run's name.

>>> import json, tempfile, pathlib
>>> rows = [{"reward": 1.0, "text": "yes", "role": "actor", "rank": 0}]
>>> rec = {"key": "reward", "top": rows, "bottom": rows, "random": rows, "rows": 1,
...        "dropped": 0, "cut": 0}
>>> path = pathlib.Path(tempfile.mkdtemp()) / "r.jsonl"
>>> _ = path.write_text(json.dumps({"run": "r", "step": 4, "samples": {"s": rec}}) + "\\n")
>>> run = load_run_samples(path)
>>> step, names = select(run, None, None)
>>> print("\\n".join(render_name(names[0], step, ("top",), width=60, lines=3)))
== step 4  s  by reward: 1 rows, 0 dropped, 0 cut
<BLANKLINE>
-- top 1 (highest reward)
#1  actor/0  reward=1
    text  yes
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from rlpulse.runtools.compare import fmt
from rlpulse.runtools.runs import Run, RunFileError
from rlpulse.schemas.samples import CUT_MARK

SAMPLES = "samples"
"""The key of a step record's samples, beside ``metrics``."""
SETS = ("top", "bottom", "random")
COUNTS = ("rows", "dropped", "cut")
MIN_WIDTH = 40
MIN_COLUMN = 44
"""The narrowest run column ``compare --samples`` lays side by side (see the module text)."""
GAP = " | "
INDENT = "    "
_CUT = re.compile(re.escape(CUT_MARK).replace(r"\{\}", r"(\d+)") + "$")
"""The mark the sender puts at the end of a text it cut (its byte limit), and the bytes cut."""

Row = Mapping[str, Any]


class SamplesError(ValueError):
    """A request the run's samples cannot answer (no samples, no such step or name)."""


@dataclass(frozen=True)
class NameSamples:
    """One name's samples at one step, as the step's record holds them.

    >>> NameSamples("s", "reward", {"top": ({"reward": 1.0},)}, rows=1).sets["top"][0]
    {'reward': 1.0}
    """

    name: str
    key: str
    sets: Mapping[str, tuple[Row, ...]]
    rows: int = 0
    dropped: int = 0
    cut: int = 0

    def counts(self) -> str:
        return f"{self.rows} rows, {self.dropped} dropped, {self.cut} cut"


@dataclass(frozen=True)
class RunSamples:
    """One run's samples: ``steps[step][name]``, only the steps that have samples, by step.

    ``source`` is the file read; ``repeated`` counts steps it held more than once.

    >>> RunSamples("r", "r.jsonl", repeated=2).repeat_warning().split(":")[0]
    "run 'r' in r.jsonl"
    """

    run: str
    source: str
    steps: Mapping[int, Mapping[str, NameSamples]] = field(default_factory=dict)
    repeated: int = 0

    def repeat_warning(self) -> str | None:
        """The run tools' warning about steps written twice (:meth:`Run.repeat_warning`)."""
        return Run(self.run, source=self.source, repeated=self.repeated).repeat_warning()


def _parse_name(name: str, raw: Any) -> NameSamples:
    """One name's record checked: ``ValueError`` says what is wrong with it."""
    if not isinstance(raw, Mapping) or not isinstance(raw.get("key"), str):
        raise ValueError(f"samples {name!r} has no ranking key")
    sets: dict[str, tuple[Row, ...]] = {}
    for which in SETS:
        rows = raw.get(which, [])
        if not isinstance(rows, list) or not all(isinstance(r, Mapping) for r in rows):
            raise ValueError(f"samples {name!r}: {which} is not a list of rows")
        sets[which] = tuple(rows)
    counts = [raw.get(c, 0) for c in COUNTS]
    if any(type(c) is not int for c in counts):
        raise ValueError(f"samples {name!r}: {', '.join(COUNTS)} must be integers")
    return NameSamples(name, raw["key"], sets, *counts)


def load_samples(path: str | Path) -> dict[str, RunSamples]:
    """Every run in ``path`` by name, in order of first appearance, with its samples (a run
    that logged none has no steps). :class:`RunFileError` names the line that is not a step
    record or holds malformed samples."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise RunFileError(path, f"cannot read: {exc.strerror}") from None
    runs: dict[str, dict[int, dict[str, NameSamples]]] = {}
    repeated: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            run, step = str(obj["run"]), int(obj["step"])
            raw = obj.get(SAMPLES) or {}
            if not isinstance(raw, Mapping):
                raise ValueError(f"{SAMPLES} is not a mapping of names")
            names = {str(n): _parse_name(str(n), r) for n, r in raw.items()}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise RunFileError(path, f"not a step record with samples ({exc})", number) from None
        steps = runs.setdefault(run, {})
        if step in steps:  # a repeated step: counted, and the last one wins
            repeated[run] = repeated.get(run, 0) + 1
        steps[step] = names
    if not runs:
        raise RunFileError(path, "holds no steps")
    return {
        run: RunSamples(
            run,
            str(path),
            {s: names for s, names in sorted(steps.items()) if names},
            repeated.get(run, 0),
        )
        for run, steps in runs.items()
    }


def load_run_samples(path: str | Path, run: str | None = None) -> RunSamples:
    """The run named ``run`` in ``path``; without a name, the file's only run."""
    runs = load_samples(path)
    if run is None:
        if len(runs) > 1:
            raise RunFileError(
                path, f"holds several runs ({', '.join(runs)}): choose one with --run"
            )
        return next(iter(runs.values()))
    if run not in runs:
        raise RunFileError(path, f"has no run {run!r} (it has {', '.join(runs)})")
    return runs[run]


def steps_text(steps: Sequence[int]) -> str:
    """A list of steps short enough for one line.

    >>> steps_text([1, 2, 3]), steps_text(range(0, 100, 10))
    ('1, 2, 3', '0, 10, 20, ..., 70, 80, 90 (10 steps)')
    """
    steps = list(steps)
    if len(steps) <= 8:
        return ", ".join(map(str, steps))
    head, tail = ", ".join(map(str, steps[:3])), ", ".join(map(str, steps[-3:]))
    return f"{head}, ..., {tail} ({len(steps)} steps)"


def select(run: RunSamples, step: int | None, name: str | None) -> tuple[int, list[NameSamples]]:
    """The step (default: the last with samples) and its samples, every name or ``name``."""
    if not run.steps:
        raise SamplesError(
            f"{run.source}: run {run.run!r} has no samples at any step (a worker logs them "
            "with Samples(rows, key=...))"
        )
    if step is None:
        step = max(run.steps)
    elif step not in run.steps:
        raise SamplesError(
            f"{run.source}: step {step} of run {run.run!r} has no samples; steps with samples: "
            f"{steps_text(list(run.steps))}"
        )
    names = run.steps[step]
    if name is None:
        return step, list(names.values())
    if name not in names:
        raise SamplesError(
            f"{run.source}: step {step} has no samples named {name!r}; it has {', '.join(names)}"
        )
    return step, [names[name]]


# ---------------------------------------------------------------------------------------------
# Text


def _printable(text: str) -> str:
    """Control characters (a generation can hold terminal escapes) written as escapes."""
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() or c in "\n\t" else ascii(c)[1:-1] for c in text.replace("\r\n", "\n")
    )


def wrap_text(text: str, width: int, lines: int) -> list[str]:
    """``text`` wrapped to ``width``, its own line breaks kept; beyond ``lines`` lines (0: no
    limit) cut, with a note of how long the whole text is.

    >>> wrap_text("one two three four five six", 14, 2)
    ['one two three', 'four five six']
    >>> wrap_text("one two three four five six", 9, 2)
    ['one two', 'three', '… 27', 'chars in', 'all, 4', 'lines', '(--lines', '0: all)']
    """
    if not text:
        return ['""']
    wrapped: list[str] = []
    for para in _printable(text).split("\n"):
        wrapped += textwrap.wrap(para, width, break_on_hyphens=False) or [""]
    while len(wrapped) > 1 and not wrapped[-1]:
        wrapped.pop()
    if lines and len(wrapped) > lines:
        note = f"… {len(text):,} chars in all, {len(wrapped)} lines (--lines 0: all)"
        sent_cut = _CUT.search(text)
        if sent_cut:  # the mark is at the end, out of sight: say it here
            note += f"; the worker cut {int(sent_cut.group(1)):,} bytes more"
        return [*wrapped[:lines], *textwrap.wrap(note, width)]
    return wrapped


def origin(row: Row) -> tuple[str, str, str]:
    """``role/rank`` of the rank that logged a row, and the fields holding them (a row's own
    ``role`` or ``rank`` field moves the origin to ``origin_role``/``origin_rank``)."""
    role_f = "origin_role" if "origin_role" in row else "role"
    rank_f = "origin_rank" if "origin_rank" in row else "rank"
    return f"{row.get(role_f, '?')}/{row.get(rank_f, '?')}", role_f, rank_f


def render_row(row: Row, index: int, key: str, width: int, lines: int) -> list[str]:
    """One row in at most ``width`` columns: ``#i role/rank key=value`` and the other scalar
    fields, wrapped; then each text field beside its name, wrapped and cut to ``lines``."""
    where, role_f, rank_f = origin(row)
    head = [f"#{index}", where, f"{key}={fmt(row.get(key))}"]
    texts: list[tuple[str, str]] = []
    for name, value in row.items():
        if name in (key, role_f, rank_f):
            continue
        if isinstance(value, str):
            texts.append((name, value))
        else:
            head.append(f"{name}={fmt(value)}")
    out = textwrap.wrap("  ".join(head), width, subsequent_indent=INDENT, break_on_hyphens=False)
    # Texts start in one column after their names; a name too long for that goes on a line
    # of its own, so a narrow column never overflows.
    label = min(max((len(n) for n, _ in texts), default=0), width // 3)
    pad = f"{INDENT}{' ' * label}  "
    for name, value in texts:
        body = wrap_text(value, max(width - len(pad), 8), lines)
        if len(name) > label:
            out.append(textwrap.shorten(f"{INDENT}{name}", width, placeholder="…"))
            out += [pad + line for line in body]
        else:
            out.append(f"{INDENT}{name.ljust(label)}  {body[0]}")
            out += [pad + line for line in body[1:]]
    return out


def set_title(which: str, n: int, ns: NameSamples) -> str:
    if which == "top":
        return f"-- top {n} (highest {ns.key})"
    if which == "bottom":
        return f"-- bottom {n} (lowest {ns.key})"
    return f"-- random {n} (uniform over the {ns.rows} rows)"


def render_name(
    ns: NameSamples, step: int, sets: Sequence[str], *, width: int, lines: int
) -> list[str]:
    """One name's samples at one step: a header, then each set's rows."""
    out = [f"== step {step}  {ns.name}  by {ns.key}: {ns.counts()}"]
    for which in sets:
        rows = ns.sets[which]
        out += ["", set_title(which, len(rows), ns)]
        if not rows:
            out.append(f"{INDENT}(none)")
        for i, row in enumerate(rows, start=1):
            out += render_row(row, i, ns.key, width, lines)
    return out


def selected_json(
    run: RunSamples, step: int, names: Sequence[NameSamples], sets: Sequence[str]
) -> dict[str, Any]:
    """The selection as a JSON-ready object (``--json``)."""
    return {
        "run": run.run,
        "step": step,
        SAMPLES: {
            ns.name: {
                "key": ns.key,
                **{c: getattr(ns, c) for c in COUNTS},
                **{which: list(ns.sets[which]) for which in sets},
            }
            for ns in names
        },
    }


# ---------------------------------------------------------------------------------------------
# Runs next to each other (compare --samples)


def _side_by_side(blocks: Sequence[list[str]], column: int) -> list[str]:
    """Blocks of lines as columns ``column`` wide, joined by :data:`GAP`."""
    return [
        GAP.join(line.ljust(column) for line in band).rstrip()
        for band in itertools.zip_longest(*blocks, fillvalue="")
    ]


def render_compare(
    runs: Sequence[tuple[str, RunSamples]],
    step: int,
    name: str | None,
    *,
    width: int,
    lines: int,
) -> list[str]:
    """Each run's samples at ``step`` (every name any run has there, or ``name``), the runs
    side by side when the width allows a :data:`MIN_COLUMN` column each, else one after the
    other per set. A run without samples there says so in its place."""
    at = [(label, run.steps.get(step, {})) for label, run in runs]
    names = list(dict.fromkeys(n for _, by_name in at for n in by_name))
    if not names:
        have = "; ".join(f"{label}: {steps_text(list(r.steps)) or 'none'}" for label, r in runs)
        raise SamplesError(f"no run has samples at step {step} (steps with samples: {have})")
    if name is not None:
        if name not in names:
            raise SamplesError(
                f"no run has samples named {name!r} at step {step} (they have {', '.join(names)})"
            )
        names = [name]
    n = len(runs)
    column = (width - len(GAP) * (n - 1)) // n
    beside = n > 1 and column >= MIN_COLUMN
    row_width = column if beside else width
    out: list[str] = []
    for current in names:
        parts = [(label, by_name.get(current)) for label, by_name in at]
        out.append(f"== step {step}  {current}")
        heads = [
            f"[{label}] " + (f"by {ns.key}: {ns.counts()}" if ns else "no samples")
            for label, ns in parts
        ]
        if beside:
            out += _side_by_side([textwrap.wrap(h, column) for h in heads], column)
        else:
            out += heads
        keys = sorted({ns.key for _, ns in parts if ns})
        for which in SETS:
            order = {"top": "highest", "bottom": "lowest"}.get(which)
            out += ["", f"-- {which}" + (f" ({order} {', '.join(keys)})" if order else "")]
            rendered = [
                [
                    render_row(row, i, ns.key, row_width, lines)
                    for i, row in enumerate(ns.sets[which], start=1)
                ]
                if ns
                else []
                for _, ns in parts
            ]
            if beside:
                rendered = [rows or [[f"{INDENT}(none)"]] for rows in rendered]
                for band in itertools.zip_longest(*rendered, fillvalue=[]):
                    out += _side_by_side(band, column)
            else:
                for (label, _), rows in zip(parts, rendered, strict=True):
                    out.append(f"[{label}]")
                    out += [line for r in rows for line in r] or [f"{INDENT}(none)"]
    return out


# ---------------------------------------------------------------------------------------------
# Command line (registered by rlpulse.runtools.cli)

LINES = 6
"""Lines of each text field shown by default (``--lines 0``: all)."""


def _width(text: str) -> int:
    width = int(text)
    if width < MIN_WIDTH:
        raise argparse.ArgumentTypeError(f"must be at least {MIN_WIDTH} columns, got {width}")
    return width


def _lines(text: str) -> int:
    lines = int(text)
    if lines < 0:
        raise argparse.ArgumentTypeError(f"must be 0 (all) or more, got {lines}")
    return lines


def _layout_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--width",
        type=_width,
        metavar="W",
        help="columns to fit the rows in (default: the terminal's, or 100)",
    )
    p.add_argument(
        "--lines",
        type=_lines,
        metavar="L",
        help=f"lines of each text field before it is cut (default {LINES}; 0: all)",
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``samples`` command's arguments."""
    p.add_argument("jsonl", help="the run's jsonl output (the jsonl sink's file)")
    p.add_argument("--run", help="the run to show when the file holds several")
    p.add_argument("--step", type=int, help="the step (default: the last one with samples)")
    p.add_argument("--name", help="the samples' logged name (default: every name at the step)")
    which = p.add_mutually_exclusive_group()
    for name, what in (
        ("top", "the rows with the highest key"),
        ("bottom", "the rows with the lowest key"),
        ("random", "the uniform random rows"),
    ):
        which.add_argument(
            f"--{name}", dest="sets", action="store_const", const=(name,), help=f"only {what}"
        )
    _layout_arguments(p)
    p.add_argument("--json", action="store_true", help="print the selected rows as JSON")


def add_compare_arguments(p: argparse.ArgumentParser) -> None:
    """``compare``'s options for samples (the table's options are its own)."""
    p.add_argument(
        "--samples",
        type=int,
        metavar="STEP",
        help="show the runs' samples at STEP next to each other instead of the table",
    )
    p.add_argument("--name", help="with --samples: only the samples of this logged name")
    _layout_arguments(p)


def _layout(args: argparse.Namespace) -> tuple[int, int]:
    width = args.width or max(shutil.get_terminal_size((100, 24)).columns, MIN_WIDTH)
    return width, LINES if args.lines is None else args.lines


def _print(text: str, stdout: TextIO) -> None:
    """Print, quietly stopping when the reader went away (``| head``, ``less`` quit early):
    the rest is discarded, as the pipe's reader asked, instead of a traceback."""
    try:
        print(text, file=stdout)
        stdout.flush()
    except BrokenPipeError:
        # Python flushes stdout again at exit: point it at /dev/null so that one succeeds.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stdout.fileno())


def samples_command(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    """``rlpulse samples``: one run's samples at one step, as text or ``--json``."""
    run = load_run_samples(args.jsonl, args.run)
    warning = run.repeat_warning()
    if warning:
        print(f"rlpulse samples: warning: {warning}", file=stderr)
    step, names = select(run, args.step, args.name)
    sets = args.sets or SETS
    if args.json:
        _print(
            json.dumps(selected_json(run, step, names, sets), indent=2, ensure_ascii=False), stdout
        )
        return 0
    width, lines = _layout(args)
    blocks = [render_name(ns, step, sets, width=width, lines=lines) for ns in names]
    _print("\n\n".join("\n".join(b) for b in blocks), stdout)
    return 0


def check_compare_options(args: argparse.Namespace) -> None:
    """Without ``--samples``, its companion options would be silently ignored: refuse them."""
    given = [f"--{o}" for o in ("name", "width", "lines") if getattr(args, o) is not None]
    if args.samples is None and given:
        raise SamplesError(f"{', '.join(given)}: only with --samples STEP (they lay out samples)")


def compare_command(
    files: Sequence[Path], args: argparse.Namespace, stdout: TextIO, stderr: TextIO
) -> int:
    """``rlpulse compare ... --samples STEP``: every run of every file, side by side."""
    table_only = [f"--{o}" for o in ("config", "key", "score", "kl") if getattr(args, o)]
    if table_only:
        raise SamplesError(f"{', '.join(table_only)}: the table's options, not --samples'")
    runs: list[RunSamples] = []
    for path in files:
        for run in load_samples(path).values():
            warning = run.repeat_warning()
            if warning:
                print(f"rlpulse compare: warning: {warning}", file=stderr)
            runs.append(run)
    names = [r.run for r in runs]
    labels = [f"{r.run} ({r.source})" if names.count(r.run) > 1 else r.run for r in runs]
    width, lines = _layout(args)
    out = render_compare(
        list(zip(labels, runs, strict=True)), args.samples, args.name, width=width, lines=lines
    )
    text = "\n".join(out)
    if args.out:
        Path(args.out).write_text(text + "\n")
        print(f"{args.out}: samples of {len(runs)} runs at step {args.samples}", file=stdout)
    else:
        _print(text, stdout)
    return 0
