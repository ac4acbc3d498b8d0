"""The Grafana vocabulary the dashboards are written in (``generate.py``): panels, rows,
layouts and the dashboard around them, and the PromQL selectors of catalog entries.

Every selector names its metric through
:func:`rlpulse.collector.output.promnames.prom_metric` and a catalog entry, never a spelled
Prometheus name, so a renamed metric changes the dashboards the next time they are written.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlpulse.collector.output.promnames import PREFIX, prom_metric
from rlpulse.schemas import metrics as M
from rlpulse.schemas.catalog import Entry, Template
from rlpulse.schemas.reductions import Stat

DS = {"type": "prometheus", "uid": "${datasource}"}
RUN = 'run=~"$run"'
JOB = 'job="rlpulse-collector"'  # deploy/prometheus/prometheus.yml, the k8s Service name


def name(entry: Entry, stat: Stat | None = None) -> str:
    """The Prometheus name of a catalog entry (of its ``stat`` output for a family)."""
    outputs = entry.output_names()
    reported = next(iter(outputs.values())) if stat is None else outputs[stat]
    return prom_metric(reported).name


def sel(entry: Entry, stat: Stat | None = None) -> str:
    return f"{name(entry, stat)}{{{RUN}}}"


def family(entry: Entry, legend: str) -> list[tuple[str, str]]:
    """Mean, max and min of a pooled family."""
    return [
        (sel(entry, s), f"{{{{run}}}} {legend} {s.value}") for s in (Stat.MEAN, Stat.MAX, Stat.MIN)
    ]


QUANTILES = (Stat.P50, Stat.P90, Stat.P99)
"""The quantile outputs of a distribution (``rlpulse.schemas.sketch.distribution``)."""


def quantiles(entry: Entry, legend: str) -> list[tuple[str, str]]:
    """p50, p90 and p99 of a distribution, then its mean."""
    return [(sel(entry, s), f"{{{{run}}}} {legend} {s.value}") for s in (*QUANTILES, Stat.MEAN)]


def template_query(regex: str, groups: Sequence[str]) -> str:
    """Series of every name matching ``regex`` (``rlpulse_`` + it), with its groups as labels."""
    full = f"{PREFIX}{regex}"
    expr = f'{{__name__=~"{full}", {RUN}}}'
    for index, label in enumerate(groups, start=1):
        expr = f'label_replace({expr}, "{label}", "${index}", "__name__", "{full}")'
    return expr


def template_regex(template: Template, groups: Sequence[tuple[str, str, str]], **fixed: str) -> str:
    """A regex for the Prometheus names of ``template`` (``rlpulse_`` left off), some
    parameters ``fixed``, the others captured.

    ``groups`` are ``(param, example value, regex)``: the name is spelled by
    :func:`prom_metric` with the example values, then each example is swapped for its regex
    (an example must occur once in the name). ``{cluster}`` and ``{phase}`` are captured as one
    group, since ``_`` joins them ambiguously (worker group names contain ``_``); a template
    without ``{phase}`` captures ``{cluster}`` alone.
    """
    phased = "phase" in template.params
    phase = template.choices["phase"][0] if phased else ""  # a real one: phases are closed
    values = {"cluster": "qqcluster", **({"phase": phase} if phased else {}), **fixed}
    values.update({param: example for param, example, _ in groups})
    body = prom_metric(template.format(**values)).name[len(PREFIX) :]
    first = (f"qqcluster_{phase}" if phased else "qqcluster", "(.+)")
    swaps = [first] + [(ex, rx) for _, ex, rx in groups]
    for example, regex in swaps:
        if body.count(example) != 1:
            raise ValueError(f"{example!r} is not in {body!r} exactly once")
        body = body.replace(example, regex)
    return body


def gpu_regex(when: str, state: str, stat: str) -> str:
    return template_regex(
        M.MEMORY_GPU, [("device_id", "7777", "([0-9]+)")], when=when, state=state, stat=stat
    )


# --------------------------------------------------------------------------- JSON building


def target(expr: str, legend: str, ref: int) -> dict[str, Any]:
    return {
        "datasource": DS,
        "expr": expr,
        "legendFormat": legend,
        "range": True,
        "refId": chr(ord("A") + ref),
    }


def panel(
    title: str,
    queries: Sequence[tuple[str, str]],
    unit: str,
    *,
    description: str = "",
    kind: str = "timeseries",
) -> dict[str, Any]:
    p: dict[str, Any] = {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": [target(e, legend, i) for i, (e, legend) in enumerate(queries)],
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
    }
    if kind == "timeseries":
        p["fieldConfig"]["defaults"]["custom"] = {
            "lineWidth": 1,
            "spanNulls": True,
            "showPoints": "never",
        }
        p["options"] = {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    else:
        p["options"] = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "background",
            "graphMode": "none",
        }
    return p


def heatmap(title: str, expr: str, unit: str, *, description: str = "") -> dict[str, Any]:
    """A heatmap of histogram buckets: ``expr`` gives one series per ``le`` (counts per
    interval), which Grafana turns into rows of cells (``format: heatmap``)."""
    p = panel(title, [(expr, "{{le}}")], unit, description=description, kind="heatmap")
    p["targets"][0]["format"] = "heatmap"
    p["options"] = {
        "calculate": False,
        "yAxis": {"unit": unit},
        "cellGap": 1,
        "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64},
        "tooltip": {"show": True, "yHistogram": True},
    }
    return p


def histogram_quantile(q: float, bucket: str, by: str = "run") -> str:
    """The ``q`` quantile over ``$__rate_interval`` of a cumulative Prometheus histogram."""
    return (
        f"histogram_quantile({q:g}, sum by ({by}, le) (rate({bucket}{{{RUN}}}[$__rate_interval])))"
    )


def row(title: str) -> dict[str, Any]:
    """A row header: the panels after it, up to the next row, form one titled group."""
    return {"type": "row", "title": title, "collapsed": False, "panels": []}


def layout(panels: list[dict[str, Any]], columns: int = 2, height: int = 8) -> list[dict[str, Any]]:
    """Panels ``columns`` to a line; a row header takes a line of its own."""
    width = 24 // columns
    y, column = 0, 0
    for index, p in enumerate(panels):
        p["id"] = index + 1
        if p["type"] == "row":
            if column:
                y, column = y + height, 0
            p["gridPos"] = {"h": 1, "w": 24, "x": 0, "y": y}
            y += 1
            continue
        p["gridPos"] = {"h": height, "w": width, "x": column * width, "y": y}
        column += 1
        if column == columns:
            y, column = y + height, 0
    return panels


def dashboard(
    uid: str, title: str, description: str, panels: list[dict[str, Any]], *, runs: bool = True
) -> dict[str, Any]:
    variables: list[dict[str, Any]] = [
        {
            "name": "datasource",
            "label": "Data source",
            "type": "datasource",
            "query": "prometheus",
            "current": {},
            "hide": 0,
            "refresh": 1,
        },
    ]
    if runs:
        query = f"label_values({prom_metric_run_step()}, run)"
        variables.append(
            {
                "name": "run",
                "label": "Run",
                "type": "query",
                "datasource": DS,
                "definition": query,
                "query": {"query": query, "refId": "runs"},
                "multi": True,
                "includeAll": True,
                "allValue": ".*",
                "current": {},
                "refresh": 2,
                "sort": 1,
                "hide": 0,
            }
        )
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["rlpulse"],
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-3h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "annotations": {"list": []},
        "links": [
            {"type": "dashboards", "tags": ["rlpulse"], "asDropdown": True, "title": "rlpulse"}
        ],
        "templating": {"list": variables},
        "panels": panels,
    }


def prom_metric_run_step() -> str:
    return "rlpulse_run_step"  # the Prometheus sink's per-run state (collector/sinks/prometheus.py)
