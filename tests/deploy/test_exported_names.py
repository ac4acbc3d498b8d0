"""Every metric a Prometheus rule or Grafana dashboard in deploy/ queries is one a live
collector really exports: a collector daemon (jsonl + prometheus sinks) is fed the whole
catalog by a producer, its /metrics is scraped, and each name (or ``__name__`` regex) in every
expression must be among the scraped names."""

from __future__ import annotations

import re
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rlpulse.collector.launch import start_collector
from rlpulse.collector.output.promnames import prom_metric
from rlpulse.collector.sinks.promexport import REPLACED
from rlpulse.producer import Fraction, Producer, Weighted
from rlpulse.schemas import metrics as M
from rlpulse.schemas.reductions import Reduction
from tests.deploy.conftest import DASHBOARDS, RULES
from tests.deploy.promql import Query, dashboard_queries, references, rule_queries

# Series Prometheus makes itself for every target; not on /metrics.
SCRAPE_SYNTHETIC = {"up"}
PHASES = (("actor_train", "train_step"), ("critic", "compute_values"), ("serve", "generate"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def whole_catalog(step: int) -> dict[str, Any]:
    """One value for every loggable catalog name, every histogram and error kind, and
    template instances of three phases on two devices (derived names are computed by the
    collector, not logged)."""
    data: dict[str, Any] = {}
    for entry in M.ENTRIES:
        if entry.derived:
            continue
        if entry.reduction is Reduction.FRACTION:
            data[entry.name] = Fraction(1, 4)
        elif entry.outputs:
            data[entry.name] = np.array([0.5, 1.0, 1.5 + step])
        elif entry.reduction is Reduction.MEAN:
            data[entry.name] = Weighted(0.5, 10)
        elif entry.reduction is Reduction.SUM:
            data[entry.name] = 1000
        else:
            data[entry.name] = 1.0 + step
    for histogram in M.HISTOGRAMS:  # buckets of three samples: the quantiles are derived
        data.update(histogram.observe([0.01, 0.2, 3.0 + step]))
    for kind in M.SERVE_ERRORS.choices["kind"]:
        data[M.SERVE_ERRORS.format(kind=kind)] = 1
    for cluster, phase in PHASES:
        for part in M.TIME_PHASE.choices["part"]:
            data[M.TIME_PHASE.format(cluster=cluster, phase=phase, part=part)] = 0.5
        for when in M.MEMORY_GPU.choices["when"]:
            for state in M.MEMORY_GPU.choices["state"]:
                for stat in M.MEMORY_GPU.choices["stat"]:
                    for device in (0, 1):
                        name = M.MEMORY_GPU.format(
                            cluster=cluster,
                            phase=phase,
                            when=when,
                            state=state,
                            stat=stat,
                            device_id=device,
                        )
                        data[name] = 0.5 if stat.endswith("_frac") else 12.0
            for kind in M.MEMORY_CPU.choices["kind"]:
                data[M.MEMORY_CPU.format(cluster=cluster, phase=phase, when=when, kind=kind)] = 3.0
        for part in M.TIME_PHASE_GPU.choices["part"]:
            data[M.TIME_PHASE_GPU.format(cluster=cluster, phase=phase, part=part)] = 0.7
        for device in (0, 1):
            for stat in M.GPU_DEVICE_MEMORY.choices["stat"]:
                data[M.GPU_DEVICE_MEMORY.format(cluster=cluster, device_id=device, stat=stat)] = 9.0
            for template, value in ((M.GPU_UTILIZATION, 0.8), (M.GPU_POWER, 350.0)):
                data[template.format(cluster=cluster, device_id=device)] = value
            data[M.GPU_TEMPERATURE.format(cluster=cluster, device_id=device)] = 61.0
    return data


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[set[str]]:
    """The sample names on a live collector's /metrics after 3 steps of the whole catalog."""
    tmp = tmp_path_factory.mktemp("collector")
    out, port = tmp / "out.jsonl", _free_port()
    config = {
        "track_with": ["prometheus", "jsonl"],
        "tracker_kwargs": {
            "prometheus": {"host": "127.0.0.1", "port": port},
            "jsonl": {"path": str(out)},
        },
        "grace_s": 5,
    }
    with (tmp / "collector.log").open("w") as log:
        collector = start_collector(config, stderr=log, stdout=subprocess.DEVNULL)
    try:
        # Two ranks, so the collector derives the stragglers of every phase too.
        producers = [
            Producer(collector.address, run="names", role="actor_train", rank=r, world_size=2)
            for r in range(2)
        ]
        for step in range(3):
            for producer in producers:
                producer.log(whole_catalog(step), step=step)
            time.sleep(0.05)  # step wall time > 0, so system/tps exists
        for producer in producers:
            producer.close()
        deadline = time.monotonic() + 30
        while not out.exists() or len(out.read_text().splitlines()) < 3:
            assert time.monotonic() < deadline, (tmp / "collector.log").read_text()
            time.sleep(0.1)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
        families = list(text_string_to_metric_families(text))
        names = {s.name for f in families for s in f.samples}
        # A family declared with no series yet (malformed messages, by reason: none so far)
        # is exported all the same; a counter's samples carry the _total suffix.
        names |= {f"{f.name}_total" if f.type == "counter" else f.name for f in families}
        yield names
    finally:
        assert collector.stop() == 0


def all_queries() -> list[Query]:
    queries = [q for path in RULES for q in rule_queries(path)]
    queries += [q for path in DASHBOARDS for q in dashboard_queries(path)]
    return queries


def test_the_live_collector_exports_the_whole_catalog(exported: set[str]) -> None:
    reported = {out for n in whole_catalog(0) for out in M.CATALOG.resolve(n).outputs.values()}
    reported |= {e.name for e in M.ENTRIES if e.derived}
    # histograms and errors by kind are cumulative Prometheus histograms and counters
    expected = {prom_metric(n).name for n in reported - REPLACED}
    for histogram in M.HISTOGRAMS:
        expected |= {f"{prom_metric(histogram.name).name}_{s}" for s in ("bucket", "sum", "count")}
    expected.add(prom_metric(M.SERVE_ERRORS_TOTAL.name).name)
    assert len(expected) > 150
    assert expected <= exported, sorted(expected - exported)
    stale = {prom_metric(n).name for n in REPLACED} - {prom_metric(M.SERVE_ERRORS_TOTAL.name).name}
    assert not stale & exported, sorted(stale & exported)
    assert {
        "rlpulse_run_step",
        "rlpulse_sink_lag_seconds",
        "process_cpu_seconds_total",
        "rlpulse_collector_producer_dropped_total",
    } <= exported


def test_every_rule_and_dashboard_query_names_an_exported_metric(exported: set[str]) -> None:
    queries = all_queries()
    assert len(queries) > 50
    unknown, unmatched, used = [], [], set()
    for q in queries:
        refs = references(q.expr)
        assert refs.names or refs.regexes, f"{q.where}: no metric found in {q.expr!r}"
        for name in refs.names - SCRAPE_SYNTHETIC:
            used.add(name)
            if name not in exported:
                unknown.append(f"{q.where}: {name}")
        for regex in refs.regexes:
            hits = {n for n in exported if re.fullmatch(regex, n)}  # PromQL anchors regexes
            used |= hits
            if not hits:
                unmatched.append(f"{q.where}: {regex}")
    assert unknown == [], unknown
    assert unmatched == [], unmatched
    # the template panels really select the phase and device series
    assert (
        prom_metric(
            M.MEMORY_GPU.format(
                cluster="critic",
                phase="compute_values",
                when="end",
                state="onload",
                stat="max_allocated",
                device_id=1,
            )
        ).name
        in used
    )


@pytest.mark.parametrize(
    ("expr", "names", "regexes"),
    [
        (
            'sum by (run) (rate(a_total{job="x"}[5m])) > on (run) group_left b offset 5m',
            {"a_total", "b"},
            [],
        ),
        ("max without(role) (x) < 0.2 * max by (run) (max_over_time(x[6h:1m]))", {"x"}, []),
        ('absent(up{job="rlpulse-collector"})', {"up"}, []),
        (
            '{__name__="exact"} or {__name__=~"rlpulse_(a|b)_bytes", run=~"$run"}',
            {"exact"},
            ["rlpulse_(a|b)_bytes"],
        ),
        ('label_replace(m{x="}"}, "dst", "$1", "src", "(.*)") / 2^30 + 1e3 - 0x1f', {"m"}, []),
        ("time() - max(ts) > 900 and bool vector(1) unless y", {"ts", "y"}, []),
        ("rate(c[$__rate_interval]) * 60", {"c"}, []),
    ],
)
def test_references(expr: str, names: set[str], regexes: list[str]) -> None:
    refs = references(expr)
    assert (refs.names, refs.regexes) == (names, regexes)


def test_references_refuses_what_it_cannot_check() -> None:
    with pytest.raises(ValueError, match="negative __name__"):
        references('{__name__!~"a.*"}')


def test_queries_come_from_every_file() -> None:
    wheres = {q.where.split(":")[0] for q in all_queries()}
    assert wheres == {p.name for p in (*RULES, *DASHBOARDS)}
    assert Path(DASHBOARDS[0]).suffix == ".json"
