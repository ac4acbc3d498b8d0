"""``rlpulse report``, ``compare``, ``samples`` and ``why``: the run tools' commands.

::

    rlpulse report RUN.jsonl [--run NAME] [--out report.png]
    rlpulse report RUN.jsonl --timeline 3:6 [--trace RUN.trace.json] [--out t.png]
    rlpulse compare A.jsonl B.jsonl [...] [--config A.yaml --config B.yaml]
                                [--key ppo.actor_lr --key ppo.batch_size] [--format markdown|text]
                                [--score NAME] [--kl NAME] [--out table.md]
    rlpulse compare A.jsonl B.jsonl --samples STEP [--name NAME] [--width W] [--lines L]
    rlpulse samples RUN.jsonl [--step N] [--name NAME] [--top|--bottom|--random] [--json]
    rlpulse why RUN.jsonl [--step N] [--run NAME]

``compare`` shows every run of every file given, one row each, with the score, loss, KL and
throughput under the names the runs logged them (:mod:`rlpulse.runtools.compare`); a
``--score`` or ``--kl`` no run logged is an error naming the nearest names they did log. ``--config`` gives each file's
run configuration (YAML, e.g. the trainer's ``--config`` file), once per file and in the same
order; without it, the configuration the collector recorded with each run (``config`` in its
jsonl, from ``Producer.run_config``), else a ``config.yaml`` next to the jsonl file. ``--key``
names a value in those configs by its dotted path (``ppo.actor_lr``); it becomes a column, and
a key that no run's configuration has is warned about on stderr (the table is still printed).
``compare --samples STEP`` shows the runs' samples at that step instead of the table, and
``samples`` one run's (:mod:`rlpulse.runtools.samples`). ``why`` shows where a step's time went
against the run's median step, from the step ledger (:mod:`rlpulse.runtools.why`).

>>> main(["compare", "--help"])  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, TextIO

import yaml

from rlpulse.runtools import samples, why
from rlpulse.runtools.compare import (
    RUN_CONFIG,
    CompareError,
    missing_key_warnings,
    render,
    table,
)
from rlpulse.runtools.panels import own_names
from rlpulse.runtools.report import ReportError, draw_report
from rlpulse.runtools.runs import Run, RunFileError, load_run, load_runs
from rlpulse.runtools.timeline import draw_timeline, load_trace, parse_steps
from rlpulse.schemas.spans import trace_path


def _warn_repeats(run: Run, command: str, stderr: TextIO) -> None:
    warning = run.repeat_warning()
    if warning:
        print(f"rlpulse {command}: warning: {warning}", file=stderr)


def _report(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    if args.timeline:
        return _timeline(args, stdout)
    run = load_run(args.jsonl, args.run)
    _warn_repeats(run, "report", stderr)
    out = Path(args.out) if args.out else _default_png(Path(args.jsonl), args.run)
    drawn = draw_report(run, out, samples.load_run_samples(args.jsonl, run.name))
    own = set(own_names(run))
    mine = sum(1 for p in drawn.panels if p.names[0] in own)
    print(
        f"{out}: {run.name}, {len(run.steps)} steps, {len(drawn.panels) - mine} panels of "
        f"known names, {mine} of the run's own names",
        file=stdout,
    )
    if drawn.not_drawn:
        print(
            f"logged, not drawn: {len(drawn.not_drawn)} names: {', '.join(drawn.not_drawn)}",
            file=stdout,
        )
    return 0


def _timeline(args: argparse.Namespace, stdout: TextIO) -> int:
    run = load_run(args.jsonl, args.run)
    trace = (
        Path(args.trace) if args.trace else trace_path(Path(args.jsonl).parent / "traces", run.name)
    )
    if not trace.exists():
        raise ReportError(
            f"{trace}: no trace file (the collector writes one with the `trace` tracker; "
            "give its file with --trace)"
        )
    steps = parse_steps(args.timeline)
    out = (
        Path(args.out)
        if args.out
        else trace.with_name(f"{trace.name}-steps-{args.timeline.replace(':', '-')}.png")
    )
    bars = draw_timeline(load_trace(trace), steps, out)
    print(
        f"{out}: {run.name}, steps {steps.start}..{steps.stop - 1}, {bars} phase bars", file=stdout
    )
    return 0


def _default_png(jsonl: Path, run: str | None) -> Path:
    stem = jsonl.stem + (f"-{run}" if run else "")
    return jsonl.with_name(f"{stem}-report.png")


def _load_config(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise CompareError(f"--config {path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise CompareError(f"--config {path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise CompareError(f"--config {path}: must hold a YAML mapping")
    return data


def _compare(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    files = [Path(p) for p in args.jsonl]
    if args.samples is not None:
        return samples.compare_command(files, args, stdout, stderr)
    samples.check_compare_options(args)
    if args.config and len(args.config) != len(files):
        raise CompareError(
            f"--config given {len(args.config)} times for {len(files)} jsonl files: "
            "give one per file, in the same order"
        )
    runs: list[Run] = []
    labels: list[str] = []
    configs: list[dict[str, Any] | None] = []
    for index, path in enumerate(files):
        if args.config:
            config: dict[str, Any] | None = _load_config(Path(args.config[index]))
        elif (path.parent / RUN_CONFIG).is_file():
            config = _load_config(path.parent / RUN_CONFIG)
        else:
            config = None
        for run in load_runs(path).values():
            _warn_repeats(run, "compare", stderr)
            runs.append(run)
            labels.append(run.name)
            recorded = dict(run.config) if run.config is not None and not args.config else None
            configs.append(recorded if recorded is not None else config)
    names = [run.name for run in runs]
    for i, run in enumerate(runs):
        if names.count(run.name) > 1:  # the same run name in two files: say which file
            labels[i] = f"{run.name} ({run.source})"
    for warning in missing_key_warnings(configs, args.key):
        print(f"rlpulse compare: warning: {warning}", file=stderr)
    t = table(runs, labels, configs=configs, keys=args.key, score=args.score, kl=args.kl)
    for note in t.notes:
        print(f"rlpulse compare: note: {note}", file=stderr)
    text = render(t, args.format)
    if args.out:
        Path(args.out).write_text(text + "\n")
        print(f"{args.out}: {len(runs)} runs", file=stdout)
    else:
        print(text, file=stdout)
    return 0


def parser(prog: str = "rlpulse") -> argparse.ArgumentParser:
    """The run tools' commands under ``prog`` (what ``--help`` shows)."""
    top = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    sub = top.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="a PNG of one run's main curves")
    rep.add_argument("jsonl", help="the run's jsonl output (the jsonl sink's file)")
    rep.add_argument("--run", help="the run to draw when the file holds several")
    rep.add_argument("--out", help="PNG to write (default: <jsonl stem>-report.png beside it)")
    rep.add_argument(
        "--timeline",
        metavar="STEPS",
        help="draw a timeline of these steps instead (3, or 3:6 for 3..5): ranks as rows, "
        "phases as bars, from the run's trace file",
    )
    rep.add_argument(
        "--trace", help="the run's trace file (default: traces/<run>.trace.json beside the jsonl)"
    )
    cmp_ = sub.add_parser("compare", help="a table comparing runs side by side")
    cmp_.add_argument("jsonl", nargs="+", help="jsonl files; every run in each is a row")
    cmp_.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="YAML",
        help="a file's run configuration; once per jsonl file, same order",
    )
    cmp_.add_argument(
        "--key",
        action="append",
        default=[],
        metavar="DOTTED.KEY",
        help="a configuration value to show, e.g. ppo.actor_lr (repeatable)",
    )
    cmp_.add_argument("--format", choices=("markdown", "text"), default="markdown")
    cmp_.add_argument(
        "--score",
        help="the score metric, one name some run logged (default: the validation and the "
        "training score, under the names the runs logged them: val/score/mean, "
        "critic/score/mean, TRL's reward...)",
    )
    cmp_.add_argument(
        "--kl",
        help="the KL metric, one name some run logged (default: actor/ref_kl if logged, else "
        "actor/kl_loss, or verl's and TRL's names of them)",
    )
    cmp_.add_argument("--out", help="write the table here instead of printing it")
    samples.add_compare_arguments(cmp_)
    samples.add_arguments(sub.add_parser("samples", help="a run's sample rows at one step"))
    why.add_arguments(
        sub.add_parser("why", help="where a step's time went, against the run's median step")
    )
    return top


def main(
    argv: list[str],
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    prog: str = "rlpulse",
) -> int:
    """Run ``report``, ``compare``, ``samples`` or ``why`` (``argv[0]``); 0 on success, 2 on bad
    input. ``prog``
    is the command's name in ``--help`` (``rlpulse.cli.PROG``)."""
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    args = parser(prog).parse_args(argv)
    try:
        if args.command == "report":
            return _report(args, stdout, stderr)
        if args.command == "samples":
            return samples.samples_command(args, stdout, stderr)
        if args.command == "why":
            return why.why_command(args, stdout, stderr)
        return _compare(args, stdout, stderr)
    except (RunFileError, CompareError, ReportError, samples.SamplesError) as exc:
        print(f"rlpulse {args.command}: {exc}", file=stderr)
        return 2
