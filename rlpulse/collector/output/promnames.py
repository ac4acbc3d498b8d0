"""Prometheus names for rlpulse metrics, decided in one function: :func:`prom_metric`.

A reported name (``time/rollout``, ``memory/cpu/actor_train/train_step/end/rss``) becomes a
Prometheus name by these rules, following https://prometheus.io/docs/practices/naming/:

* the ``rlpulse_`` application prefix;
* every run of characters outside ``[a-zA-Z0-9_]`` (``/``, ``.``, ``-``, ``@``) becomes one
  ``_``, and the name is lower-cased (camelCase is not Prometheus style);
* the catalog's unit becomes a base-unit suffix, unless the name already has it as a word:
  seconds, bytes (the catalog keeps memory in GiB, as ROLL does: values are scaled by 1024**3),
  ratio, tokens, samples, tokens_per_second, nats, watts, celsius; unitless units ("1", "score") add nothing;
* metrics the catalog marks ``cumulative`` (samples and tokens since the run began) are
  counters and end in ``_total``, so ``rate()`` works; everything else is a gauge.

>>> m = prom_metric("memory/cpu/actor_train/train_step/end/rss")
>>> m.name, m.kind, m.scale
('rlpulse_memory_cpu_actor_train_train_step_end_rss_bytes', 'gauge', 1073741824.0)
>>> prom_metric("system/tokens").name
'rlpulse_system_tokens_total'
>>> prom_metric("time/actor_train/train_step/total").name
'rlpulse_time_actor_train_train_step_total_seconds'
>>> m = prom_metric("straggler/actor_train/train_step/lag"); m.name, m.labels
('rlpulse_straggler_lag_seconds', (('cluster', 'actor_train'), ('phase', 'train_step')))
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from rlpulse.schemas.catalog import Catalog, Template
from rlpulse.schemas.ledger import LEDGER_BUCKET, LEDGER_FRACTION, LEDGER_PATH
from rlpulse.schemas.metrics import CATALOG, STRAGGLER

PREFIX = "rlpulse_"
NONFINITE = f"{PREFIX}nonfinite_samples_total"
"""Samples the producers dropped as NaN or infinite, per run and metric (``StepRecord.nonfinite``,
summed over the run's steps): a counter, labelled ``run``, ``role`` and ``metric`` (the
Prometheus name of the metric they were logged as, :func:`prom_metric`)."""

# Catalog unit -> (Prometheus base-unit suffix, factor from the catalog's unit to the base unit).
UNITS: dict[str, tuple[str, float]] = {
    "s": ("seconds", 1.0),
    "GiB": ("bytes", float(1024**3)),
    "ratio": ("ratio", 1.0),
    "tokens": ("tokens", 1.0),
    "samples": ("samples", 1.0),
    "tokens/s": ("tokens_per_second", 1.0),
    "nats": ("nats", 1.0),
    "W": ("watts", 1.0),
    "celsius": ("celsius", 1.0),
    "rank": ("", 1.0),
    "score": ("", 1.0),
    "1": ("", 1.0),
    "": ("", 1.0),
}

LABELLED: tuple[tuple[Template, tuple[str, ...]], ...] = (
    (STRAGGLER, ("cluster", "phase")),
    (LEDGER_BUCKET, ("bucket",)),
    (LEDGER_FRACTION, ("bucket",)),
    (LEDGER_PATH, ("cluster", "phase", "part")),
)
"""Templates exported as one family per remaining parameter, these parameters as labels:
``straggler/actor_train/train_step/lag`` is
``rlpulse_straggler_lag_seconds{cluster="actor_train", phase="train_step"}``, so one alert
covers every phase; ``ledger/gaps`` is ``rlpulse_ledger_seconds{bucket="gaps"}``, so one query
stacks a step's buckets."""

_INVALID = re.compile(r"[^a-zA-Z0-9_]+")
_UNDERSCORES = re.compile(r"_{2,}")


@dataclass(frozen=True)
class PromMetric:
    """How one reported metric appears on ``/metrics``.

    ``name`` is the sample name a PromQL query uses (counters include ``_total``); multiply the
    reported value by ``scale`` to get the base unit.

    >>> PromMetric("rlpulse_time_adv_seconds", "gauge", 1.0, "Seconds.").kind
    'gauge'
    """

    name: str
    kind: Literal["gauge", "counter"]
    scale: float
    help: str
    labels: tuple[tuple[str, str], ...] = ()
    """Labels beyond ``run`` and ``role`` (a template's parameters exported as labels)."""


def sanitize(name: str) -> str:
    """``name`` as a Prometheus name body: ``[a-z0-9_]``, single underscores, none at the ends.

    >>> sanitize("actor/ppo_ratio-high.clipfrac@sum")
    'actor_ppo_ratio_high_clipfrac_sum'
    """
    body = _UNDERSCORES.sub("_", _INVALID.sub("_", name)).strip("_")
    return body.lower()


def prom_metric(name: str, catalog: Catalog = CATALOG) -> PromMetric:
    """The Prometheus name, type, scale and help of the reported metric ``name``.

    Names outside the catalog keep their spelling (sanitised and prefixed), no unit and gauge
    type. Two reported names can map to one Prometheus name (``a/b`` and ``a_b``); the
    Prometheus sink keeps the first and warns.

    >>> prom_metric("actor/clipfrac").name
    'rlpulse_actor_clipfrac_ratio'
    >>> prom_metric("tokens/response_length/mean").name
    'rlpulse_tokens_response_length_mean'
    """
    resolved = catalog.resolve(name)  # describes a reported name; merging decided it already
    suffix, scale = UNITS.get(resolved.unit, ("", 1.0))
    body = sanitize(name)
    labels: tuple[tuple[str, str], ...] = ()
    for template, params in LABELLED:
        found = template.match(name)
        if found is not None:  # one family, the parameters as labels
            body = sanitize(template.pattern.format(**{**found, **dict.fromkeys(params, "")}))
            labels = tuple((p, found[p]) for p in params)
            break
    if suffix and f"_{suffix}_" not in f"_{body}_":
        body = f"{body}_{suffix}"
    kind: Literal["gauge", "counter"] = "counter" if resolved.cumulative else "gauge"
    if kind == "counter" and not body.endswith("_total"):
        body += "_total"
    what = resolved.help or "Not in the rlpulse catalog; value as logged."
    where = "" if labels else f" (rlpulse name: {name})"
    return PromMetric(f"{PREFIX}{body}", kind, scale, f"{what}{where}", labels)
