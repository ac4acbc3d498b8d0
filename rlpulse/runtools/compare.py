"""A table comparing runs side by side: final and best score, max KL, mean throughput, and the
configuration values the user names.

Which scores: the validation score ``val/score/mean`` (held-out prompts, the honest number)
and the training rollouts' ``critic/score/mean``, each when any compared run logged it. Which
KL: ``actor/ref_kl`` (the policy's KL to the reference) when any run logged it, else
``actor/kl_loss``. Choices are made once for all runs, so a column means the same thing in
every row, and its header names the metric. Both can be forced (``score=``, ``kl=``).

>>> from rlpulse.runtools.runs import Run
>>> a = Run("a", steps=(0, 1), series={"critic/score/mean": ((0, 0.25), (1, 0.5))})
>>> print(render(table([a]), "text"))
run  steps  final critic/score/mean  best (step) critic/score/mean  max actor/kl_loss  mean system/tps
a    2      0.5                      0.5 (1)                        -                  -
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlpulse.runtools.runs import Run
from rlpulse.schemas import metrics as M
from rlpulse.schemas.reductions import Stat

VAL_SCORE = M.VAL_SCORE.output_names()[Stat.MEAN]
TRAIN_SCORE = M.CRITIC_SCORE.output_names()[Stat.MEAN]
REF_KL = M.ACTOR_REF_KL.name
KL_LOSS = M.ACTOR_KL_LOSS.name
TPS = M.SYSTEM_TPS.name
MISSING = "-"
RUN_CONFIG = "config.yaml"
"""A run's configuration beside its jsonl file, read when no ``--config`` is given (the trainer
writes its resolved configuration under this name in the run directory)."""


class CompareError(ValueError):
    """Bad input to the comparison (a config key that is not a section path, etc.)."""


@dataclass(frozen=True)
class Summary:
    """The numbers of one row. ``None``: the run never logged that metric.

    >>> Summary("a", 3, 0, 0.5, 0.75, 2, None, 10.0).best_score
    0.75
    """

    label: str
    steps: int
    partial: int
    final_score: float | None
    best_score: float | None
    best_step: int | None
    max_kl: float | None
    mean_tps: float | None


def pick(runs: Sequence[Run], preferred: str, fallback: str) -> str:
    """``preferred`` when any run logged it, else ``fallback``."""
    return preferred if any(r.has(preferred) for r in runs) else fallback


def scores_logged(runs: Sequence[Run]) -> list[str]:
    """The score metrics to show: validation and training score, those any run logged."""
    logged = [n for n in (VAL_SCORE, TRAIN_SCORE) if any(r.has(n) for r in runs)]
    return logged or [TRAIN_SCORE]


def summarize(run: Run, label: str, *, score: str, kl: str) -> Summary:
    return Summary(
        label=label,
        steps=len(run.steps),
        partial=run.partial,
        final_score=run.last(score),
        best_score=run.max(score),
        best_step=run.argmax(score),
        max_kl=run.max(kl),
        mean_tps=run.mean(TPS),
    )


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
            f"or put {RUN_CONFIG} beside it, as the trainer does)"
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


def table(
    runs: Sequence[Run],
    labels: Sequence[str] | None = None,
    *,
    configs: Sequence[Mapping[str, Any] | None] | None = None,
    keys: Sequence[str] = (),
    score: str | None = None,
    kl: str | None = None,
) -> Table:
    """One row per run; ``configs[i]`` is run i's configuration, ``keys`` the values shown."""
    labels = list(labels) if labels is not None else [r.name for r in runs]
    configs = list(configs) if configs is not None else [None] * len(runs)
    if not len(labels) == len(configs) == len(runs):
        raise CompareError("need one label and one config (or None) per run")
    scores = [score] if score else scores_logged(runs)
    kl = kl or pick(runs, REF_KL, KL_LOSS)
    header = [
        "run",
        "steps",
        *(f"{which} {name}" for name in scores for which in ("final", "best (step)")),
        f"max {kl}",
        f"mean {TPS}",
        *keys,
    ]
    rows = []
    for run, label, config in zip(runs, labels, configs, strict=True):
        cells = [label]
        for i, name in enumerate(scores):
            s = summarize(run, label, score=name, kl=kl)
            if i == 0:
                cells.append(f"{s.steps} ({s.partial} partial)" if s.partial else str(s.steps))
            best = MISSING if s.best_score is None else f"{fmt(s.best_score)} ({s.best_step})"
            cells += [fmt(s.final_score), best]
        cells += [fmt(s.max_kl), fmt(s.mean_tps), *(fmt(config_value(config, k)) for k in keys)]
        rows.append(tuple(cells))
    numeric = (False, *(True for _ in range(len(header) - 1 - len(keys))), *(False for _ in keys))
    return Table(tuple(header), tuple(rows), numeric)


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
