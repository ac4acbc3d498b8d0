"""``rlpulse why RUN.jsonl [--step N] [--run NAME]``: where a step's time went, against the
run's median step of its kind.

It reads the step ledger the collector put in each record (``ledger/...`` numbers and the
``ledger`` object: ``rlpulse.schemas.ledger``): the step's line, the cause the collector named
if the step was slow, then a table of its wall time, buckets and phases on the critical path
beside the median of the run's other steps of its kind (each row's own median), and its
critical path in order. A step's kind is which phases it ran and how often (``ledger.runs``),
as the collector's attribution takes it (``rlpulse.schemas.attribution``): a validation step
beside the other validation steps; a step of a kind the run had once, beside all its other
steps. Without ``--step``, the run's slowest step.

Exit status 0; 2 when the file cannot be read, holds no such run or step, or no ledger (the
collector computes it from phase spans: workers that log no ``phase()`` have none).

>>> main(["why", "--help"])  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import TextIO

from rlpulse.runtools.runs import RunFileError, read_records
from rlpulse.schemas.ledger import LEDGER_WALL
from rlpulse.schemas.ledger_view import line, rows
from rlpulse.schemas.record import StepRecord


class WhyError(ValueError):
    """What ``rlpulse why`` cannot answer, in words."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("jsonl", help="the run's jsonl output (the jsonl sink's file)")
    parser.add_argument("--step", type=int, help="the step (default: the run's slowest)")
    parser.add_argument("--run", help="the run, when the file holds several")


def pick_run(path: str, run: str | None) -> dict[int, StepRecord]:
    """The steps with a ledger of ``run`` in ``path`` (the file's only run without a name)."""
    records, _ = read_records(path)
    if run is None:
        if len(records) > 1:
            raise RunFileError(path, f"holds several runs ({', '.join(records)}): choose one")
        run = next(iter(records))
    if run not in records:
        raise RunFileError(path, f"has no run {run!r} (it has {', '.join(records)})")
    steps = {s: r for s, r in records[run].items() if LEDGER_WALL.name in r.metrics}
    if not steps:
        raise WhyError(
            f"no step of run {run!r} in {path} has a ledger: the collector computes it from "
            "the workers' phases (producer.phase()), and this run's records have none"
        )
    return steps


def explain(steps: Mapping[int, StepRecord], step: int | None) -> str:
    """The text ``rlpulse why`` prints for ``step`` of a run's ``steps`` (with ledgers)."""
    if step is None:
        step = max(steps, key=lambda s: (steps[s].metrics[LEDGER_WALL.name], -s))
    if step not in steps:
        have = sorted(steps)
        near = ", ".join(map(str, have[:20])) + (f" ... {have[-1]}" if len(have) > 20 else "")
        raise WhyError(f"step {step} has no ledger in this run (steps with one: {near})")
    record = steps[step]
    kind = _runs(record)
    others = [r.metrics for s, r in sorted(steps.items()) if s != step]
    alike = [r.metrics for s, r in sorted(steps.items()) if s != step and _runs(r) == kind]
    of = (
        f"of its {len(alike)} other steps of its kind"
        if alike
        else f"of its {len(others)} other steps"
    )
    others = alike or others
    wall = record.metrics[LEDGER_WALL.name]
    out = [f"run {record.run}, step {step}: {wall:.3f} s"]
    if others:
        table = rows(record.metrics, others)
        median = table[0][2]
        more = wall - median
        out[0] += (
            f"; the median step ({of}) {median:.3f} s: {more:+.3f} s ({more / median:+.0%})"
            if median > 0
            else ""
        )
    summary = line(step, record.metrics, record.ledger)
    if summary:
        out.append(summary)
    ledger = record.ledger
    if ledger is not None and ledger.cause is not None:
        out.append(
            f"cause (named by the collector against its rolling median): {ledger.cause.label()}"
            + (
                f", +{ledger.cause.seconds:.3f} s, {ledger.cause.share:.0%} of the excess"
                if ledger.cause.bucket != "mixed"
                else ""
            )
        )
    if others:
        width = max(len(name) for name, _, _ in table)
        out.append("")
        out.append(f"{'':<{width}}  {'step ' + str(step):>10}  {'median':>10}  {'difference':>10}")
        for name, mine, median in table:
            out.append(f"{name:<{width}}  {mine:>10.3f}  {median:>10.3f}  {mine - median:>+10.3f}")
    if ledger is not None and ledger.path:
        out.append("")
        out.append(f"critical path of step {step} (seconds after its start):")
        for seg in ledger.path:
            who = f"{seg.role}/{seg.rank}  {seg.phase}" if seg.role else "gap"
            out.append(f"  {seg.start:8.3f} {seg.end:8.3f}  {seg.seconds:7.3f}  {who}")
    return "\n".join(out)


def _runs(record: StepRecord) -> Mapping[str, int]:
    """The step's kind: its ledger's ``runs`` (empty in a record from before kinds)."""
    return record.ledger.runs if record.ledger is not None else {}


def why_command(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    try:
        print(explain(pick_run(args.jsonl, args.run), args.step), file=stdout)
    except WhyError as exc:
        print(f"rlpulse why: {exc}", file=stderr)
        return 2
    return 0
