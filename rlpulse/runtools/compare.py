"""A table comparing runs side by side: final and best score, final loss, max KL, mean
throughput, and the configuration values the user names.

Each metric column is a quantity (:mod:`rlpulse.runtools.quantities`) under the first of its
names a run logged, so a run of the demo trainer, of verl, of TRL or the README's worker fills
the columns with its own names (runs that logged a quantity under different names get a
column per name, :func:`columns`). Which scores: the validation score
(``val/score/mean``, verl's ``val-core/...``, TRL's ``eval_reward``: held-out prompts, the
honest number) and the training score (``critic/score/mean``, TRL's ``reward``), each when any
compared run logged it. Which loss: the policy loss (``actor/pg_loss``), else the total loss
(TRL's ``loss``). Which KL: the KL to the reference in the reward (``actor/ref_kl``, verl's
``actor/reward_kl_penalty``), else in the loss (``actor/kl_loss``, TRL's ``kl``). A column
means the same thing in every row, and its header names the metric. A quantity no run logged
has no column (:attr:`Table.notes` says so for the score).
Score and KL can be forced (``score=``, ``kl=``); a forced name no run logged is an error that
names the nearest names the runs did log.

>>> from rlpulse.runtools.runs import Run
>>> a = Run("a", steps=(0, 1), series={"critic/score/mean": ((0, 0.25), (1, 0.5))})
>>> print(render(table([a]), "text"))
run  steps  final critic/score/mean  best (step) critic/score/mean
a    2      0.5                      0.5 (1)
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlpulse.runtools import quantities as Q
from rlpulse.runtools.quantities import Quantity, first_logged
from rlpulse.runtools.runs import Run

SCORES: tuple[tuple[Quantity, ...], ...] = ((Q.VAL_SCORE,), (Q.TRAIN_SCORE,))
"""The score columns, validation first; each shown when any run logged it."""
LOSS: tuple[Quantity, ...] = (Q.POLICY_LOSS, Q.TOTAL_LOSS)
KL: tuple[Quantity, ...] = (Q.REF_KL, Q.KL_LOSS)
THROUGHPUT: tuple[Quantity, ...] = (Q.THROUGHPUT,)
MISSING = "-"
RUN_CONFIG = "config.yaml"
"""A run's configuration beside its jsonl file, read when no ``--config`` is given (the trainer
writes its resolved configuration under this name in the run directory)."""


class CompareError(ValueError):
    """Bad input to the comparison (a config key that is not a section path, a metric no run
    logged, etc.)."""


def check_logged(runs: Sequence[Run], name: str, option: str) -> None:
    """CompareError unless some run logged ``name`` (``option``: the flag that named it), with
    the nearest names the runs did log.

    >>> check_logged([Run("a", series={"reward": ((1, 0.5),)})], "rewrd", "--score")
    Traceback (most recent call last):
    ...
    rlpulse.runtools.compare.CompareError: --score rewrd: no run logged it; did you mean reward?
    """
    if any(r.has(name) for r in runs):
        return
    logged = sorted({n for r in runs for n in r.series if r.has(n)})
    near = difflib.get_close_matches(name, logged, n=4, cutoff=0.6)
    hint = f"; did you mean {', '.join(near)}?" if near else " (no logged name is close to it)"
    raise CompareError(f"{option} {name}: no run logged it{hint}")


def config_value(config: Mapping[str, Any] | None, dotted: str) -> Any:
    """``config["a"]["b"]`` for ``"a.b"``; None when any part is missing."""
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def config_has(config: Mapping[str, Any] | None, dotted: str) -> bool:
    """Whether ``config`` has the dotted key at all (its value may be null)."""
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def config_keys(config: Mapping[str, Any] | None, prefix: str = "") -> list[str]:
    """Every dotted key of ``config`` that holds a value (not a section).

    >>> config_keys({"ppo": {"actor_lr": 1e-6, "epochs": 2}, "seed": 0})
    ['ppo.actor_lr', 'ppo.epochs', 'seed']
    """
    keys: list[str] = []
    for key, value in (config or {}).items():
        if isinstance(value, Mapping) and value:
            keys += config_keys(value, f"{prefix}{key}.")
        else:
            keys.append(f"{prefix}{key}")
    return keys


def missing_key_warnings(
    configs: Sequence[Mapping[str, Any] | None], keys: Sequence[str]
) -> list[str]:
    """A warning for each ``--key`` that no run's configuration has (its column is all
    ``-``), with the nearest keys the configurations do have.

    >>> missing_key_warnings([{"ppo": {"actor_lr": 1e-6}}], ["ppo.lr", "ppo.actor_lr"])
    ["--key ppo.lr is in no run's configuration (its column shows -); did you mean ppo.actor_lr?"]
    """
    if not keys:
        return []
    if all(c is None for c in configs):
        return [
            f"--key {', '.join(keys)}: no run has a configuration (give --config per jsonl file, "
            f"put {RUN_CONFIG} beside it, as the trainer does, or send it with "
            "Producer.run_config, which the collector records in the jsonl)"
        ]
    known = sorted({k for c in configs for k in config_keys(c)})
    warnings = []
    for key in keys:
        if any(config_has(c, key) for c in configs):
            continue
        # keys whose last part ends like the key's (ppo.lr -> ppo.actor_lr), then look-alikes
        leaf = key.rsplit(".", 1)[-1]
        near = [k for k in known if k.rsplit(".", 1)[-1].endswith(leaf)]
        near += difflib.get_close_matches(key, [k for k in known if k not in near], cutoff=0.6)
        near = near[:4]
        hint = f"; did you mean {', '.join(near)}?" if near else ""
        warnings.append(f"--key {key} is in no run's configuration (its column shows -){hint}")
    return warnings


def fmt(value: Any) -> str:
    """A cell: numbers with 4 significant digits (one decimal from 100 up), the rest as text.

    >>> [fmt(v) for v in (0.8125, 12345.678, 1e-06, None, True, "adamw", 3)]
    ['0.8125', '12345.7', '1e-06', '-', 'true', 'adamw', '3']
    """
    if value is None:
        return MISSING
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.1f}" if abs(value) >= 100 else f"{value:.4g}"
    return str(value)


@dataclass(frozen=True)
class Table:
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    numeric: tuple[bool, ...]
    notes: tuple[str, ...] = ()
    """Why a column is missing: no compared run logged a score (under any of its names)."""


def _absent(what: str, quantities: Sequence[Quantity]) -> str:
    names = ", ".join(n for q in quantities for n in q.names)
    return f"no run logged a {what} ({names}): no {what} column"


def columns(quantities: Sequence[Quantity], runs: Sequence[Run]) -> list[str]:
    """The names the columns of ``quantities`` show: each run's first name of them (in the
    quantities' order of preference), each name once. Runs that logged a quantity under the
    same name share a column; a TRL run beside a demo run gets one of its own.

    >>> demo = Run("demo", series={"critic/score/mean": ((1, 0.5),)})
    >>> trl = Run("trl", series={"reward": ((1, 0.7),)})
    >>> columns(SCORES[1], [demo, trl, demo])
    ['critic/score/mean', 'reward']
    """
    names = (first_logged(quantities, [run]) for run in runs)
    return list(dict.fromkeys(n for n in names if n is not None))


def table(
    runs: Sequence[Run],
    labels: Sequence[str] | None = None,
    *,
    configs: Sequence[Mapping[str, Any] | None] | None = None,
    keys: Sequence[str] = (),
    score: str | None = None,
    kl: str | None = None,
) -> Table:
    """One row per run; ``configs[i]`` is run i's configuration, ``keys`` the values shown.
    ``score`` and ``kl`` force those columns' metric (CompareError if no run logged it)."""
    labels = list(labels) if labels is not None else [r.name for r in runs]
    configs = list(configs) if configs is not None else [None] * len(runs)
    if not len(labels) == len(configs) == len(runs):
        raise CompareError("need one label and one config (or None) per run")
    if score:
        check_logged(runs, score, "--score")
    if kl:
        check_logged(runs, kl, "--kl")
    scores = [score] if score else [n for qs in SCORES for n in columns(qs, runs)]
    losses, kls = columns(LOSS, runs), [kl] if kl else columns(KL, runs)
    tps = columns(THROUGHPUT, runs)
    # The score is what a comparison is for: say why there is none (the others are optional).
    notes = () if scores else (_absent("score", [q for qs in SCORES for q in qs]),)
    header = [
        "run",
        "steps",
        *(f"{which} {name}" for name in scores for which in ("final", "best (step)")),
        *(f"final {name}" for name in losses),
        *(f"max {name}" for name in kls),
        *(f"mean {name}" for name in tps),
        *keys,
    ]
    rows = []
    for run, label, config in zip(runs, labels, configs, strict=True):
        cells = [
            label,
            f"{len(run.steps)} ({run.partial} partial)" if run.partial else str(len(run.steps)),
        ]
        for name in scores:
            best = run.max(name)
            cells += [
                fmt(run.last(name)),
                MISSING if best is None else f"{fmt(best)} ({run.argmax(name)})",
            ]
        cells += [fmt(run.last(n)) for n in losses]
        cells += [fmt(run.max(n)) for n in kls]
        cells += [fmt(run.mean(n)) for n in tps]
        cells += [fmt(config_value(config, k)) for k in keys]
        rows.append(tuple(cells))
    numeric = (False, *(True for _ in range(len(header) - 1 - len(keys))), *(False for _ in keys))
    return Table(tuple(header), tuple(rows), numeric, notes)


def render(t: Table, style: str = "markdown") -> str:
    """``markdown`` (a GitHub table) or ``text`` (aligned columns for a terminal)."""
    widths = [max(3, *(len(c) for c in col)) for col in zip(t.header, *t.rows, strict=True)]
    if style == "text":
        lines = [
            "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            for row in (t.header, *t.rows)
        ]
        return "\n".join(lines)
    if style != "markdown":
        raise CompareError(f"unknown table style {style!r}: markdown or text")

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    rule = [("-" * (w - 1) + ":") if n else "-" * w for w, n in zip(widths, t.numeric, strict=True)]
    return "\n".join([line(t.header), line(rule), *(line(r) for r in t.rows)])
