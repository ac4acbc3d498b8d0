"""Prometheus sink: serves ``/metrics`` with the latest aggregated value of every metric.

``write()`` only stores the step's values (names from :func:`rlpulse.collector.output.promnames.prom_metric`,
labels ``run`` and ``role``); /metrics shows them with the collector's own health counters. A
metric that a step does not report keeps its last value, as a gauge should. Histograms
(``serve/latency``) are real Prometheus histograms and the server's errors are counters by kind,
summed over every step the sink has written (``promexport.Totals``): a scrape sees cumulative
counts, never one reporting window's. Counters exist before their first increment: every
rejection reason (``rlpulse.schemas.errors.REJECT_REASONS``) from start-up, and each run's
cumulative catalog metrics (``system/tokens``, ``system/samples``) from its first step, at 0.
NaN and infinite samples producers dropped are counted per run and metric
(``rlpulse_nonfinite_samples_total``, ``promnames.NONFINITE``).

What only a write changes is rendered at the first scrape after one and kept as text
(``promexport.TextCache``: rendering all at every scrape cost 2 ms of CPU, issue 24); health
families are rendered again only when a value changed.

Per-rank series are not exported: a :class:`~rlpulse.schemas.record.StepRecord` carries only values
pooled across ranks. The same server answers ``GET /sd``: the ``/metrics`` endpoints producers
registered, for Prometheus' HTTP service discovery (``rlpulse.collector.output.discovery``). The
server (``promhttp``) is bounded against abusive clients; its own counters are on the page.

>>> from prometheus_client import generate_latest
>>> sink = PrometheusSink.from_kwargs({"port": 0}, SinkContext())
>>> sink.open()
>>> sink.write(StepRecord(run="r1", step=3, metrics={"time/rollout": 2.5}))
>>> b"rlpulse_time_rollout_seconds" in generate_latest(sink.registry)
True
>>> sink.close()
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlpulse.collector.health import HTTP_METRICS
from rlpulse.collector.output.discovery import with_discovery
from rlpulse.collector.output.promnames import PromMetric, prom_metric
from rlpulse.collector.sinks.base import Sink, SinkContext, reject_unknown
from rlpulse.schemas.errors import ConfigError
from rlpulse.schemas.record import StepRecord

# This module is imported only when a prometheus tracker is configured (collector.sinks.SINKS);
# a missing library becomes a ConfigError with the install hint in from_kwargs.
try:
    from prometheus_client import CollectorRegistry, make_wsgi_app
    from prometheus_client.metrics_core import Metric

    from rlpulse.collector.sinks.promdist import DistTotals, dist_families
    from rlpulse.collector.sinks.promexport import (
        REPLACED,
        Encoder,
        FamiliesCollector,
        Family,
        FamilyData,
        ProcessSnapshot,
        TextCache,
        Totals,
        health_data,
        make_family,
        nonfinite_family,
        run_families_of,
        total_families,
    )
    from rlpulse.collector.sinks.promhttp import (
        BoundedServer,
        check_tls,
        metrics_app,
        start_server,
    )
except ImportError:  # pragma: no cover - exercised only without the optional dependency
    CollectorRegistry = None  # type: ignore[assignment,misc]

log = logging.getLogger(__name__)

FIELD = "tracker_kwargs.prometheus"
_KEYS = ("host", "port", "certfile", "keyfile", "max_runs")
DEFAULT_HOST = "127.0.0.1"
"""Loopback: /metrics is reachable from other machines only when ``host`` says so."""
DEFAULT_MAX_RUNS = 16


@dataclass
class _Run:
    """What the sink keeps of one run: its latest step and each metric's latest value."""

    step: int = -1
    time: float = 0.0
    ranks: int = 0
    partial: bool = False
    values: dict[str, tuple[float, str]] = field(default_factory=dict)
    totals: Totals = field(default_factory=lambda: Totals())
    dists: DistTotals = field(default_factory=lambda: DistTotals())


@dataclass(frozen=True)
class _Health:
    """The health families of one snapshot, each with its data, and their names."""

    families: tuple[tuple[FamilyData, Metric], ...]
    names: frozenset[str]


@dataclass(frozen=True)
class _Steps:
    """The families built from the written steps: the run state (before the health families
    on /metrics) and every metric (after them)."""

    key: tuple[int, frozenset[str]]
    """The sink's version (bumped by every write) and the health names the metrics yield to."""
    runs: list[Metric]
    metrics: list[Metric]


class PrometheusSink(Sink):
    """Serves the latest step values and collector health at ``http(s)://host:port/metrics``,
    and the registered endpoints for service discovery at ``/sd``.

    kwargs: ``port`` (required; 0 picks a free one, see :attr:`address`), ``host`` (default
    ``127.0.0.1``), ``certfile`` and ``keyfile`` (TLS, both or neither), ``max_runs`` (runs kept,
    least recently written dropped first; default 16). A run's series leave /metrics when the
    collector forgets the run (``run_retention_s`` after it ended).

    >>> sink = PrometheusSink.from_kwargs({"host": "127.0.0.1", "port": 9464}, SinkContext())
    >>> sink.name
    'prometheus'
    """

    name = "prometheus"

    def __init__(
        self,
        ctx: SinkContext,
        *,
        port: int,
        host: str = DEFAULT_HOST,
        certfile: str | None = None,
        keyfile: str | None = None,
        max_runs: int = DEFAULT_MAX_RUNS,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._ctx = ctx
        self._host = host
        self._port = port
        self._certfile = certfile
        self._keyfile = keyfile
        self._max_runs = max_runs
        self._own_registry = registry is None
        self.registry = registry if registry is not None else CollectorRegistry()
        self._lock = threading.Lock()
        """Guards ``_runs`` and ``_version``, taken by write() and briefly by scrapes."""
        self._runs: dict[str, _Run] = {}
        self._version = 0
        """Bumped by every write(): the families built for an older one are stale."""
        self._render_lock = threading.Lock()
        """Guards what scrapes keep: ``_steps``, ``_health`` and ``_texts``."""
        self._steps: _Steps | None = None
        self._health: dict[str, tuple[FamilyData, Metric]] = {}
        """Each health family by name, with the data it was built from."""
        self._texts = TextCache()
        self._process = ProcessSnapshot()  # the collector's own CPU and memory
        self._plain = make_wsgi_app(self.registry)
        """Serves what ``promhttp.metrics_app`` leaves to prometheus_client (``name[]``...)."""
        self._server: BoundedServer | None = None
        self._warned: set[str] = set()
        self._prom: dict[str, PromMetric] = {}
        """Each reported name's Prometheus form, worked out on its first scrape."""
        # Each run's counters (tokens and samples trained on) are exported from its first
        # step, at 0 until they grow, so that rate() and increase() see the first increment.
        self._counters = frozenset(
            out
            for entry in ctx.catalog.entries.values()
            if entry.cumulative
            for out in entry.output_names().values()
        )
        self.registry.register(FamiliesCollector(self.families))
        self.registry.register(self._process)

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any], ctx: SinkContext) -> PrometheusSink:
        """Validate ``tracker_kwargs`` for prometheus; raise ConfigError naming the field."""
        if CollectorRegistry is None:
            raise ConfigError(
                FIELD,
                "needs prometheus_client: pip install 'rlpulse[trackers]' "
                "(or pip install prometheus_client)",
            )
        reject_unknown(kwargs, _KEYS, FIELD)
        if "port" not in kwargs:
            raise ConfigError(f"{FIELD}.port", "is required (0 picks a free port)")
        port = kwargs["port"]
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ConfigError(f"{FIELD}.port", "must be an integer from 0 to 65535", port)
        host = kwargs.get("host", DEFAULT_HOST)
        if not isinstance(host, str) or not host:
            raise ConfigError(f"{FIELD}.host", "must be a host name or address", host)
        max_runs = kwargs.get("max_runs", DEFAULT_MAX_RUNS)
        if isinstance(max_runs, bool) or not isinstance(max_runs, int) or max_runs < 1:
            raise ConfigError(f"{FIELD}.max_runs", "must be a positive integer", max_runs)
        tls = {k: kwargs.get(k) for k in ("certfile", "keyfile")}
        if (tls["certfile"] is None) != (tls["keyfile"] is None):
            missing = "keyfile" if tls["keyfile"] is None else "certfile"
            raise ConfigError(f"{FIELD}.{missing}", "TLS needs both certfile and keyfile")
        for key, path in tls.items():
            if path is not None and (not isinstance(path, str) or not Path(path).is_file()):
                raise ConfigError(f"{FIELD}.{key}", "is not a readable file", path)
        if tls["certfile"] is not None and tls["keyfile"] is not None:
            check_tls(tls["certfile"], tls["keyfile"], FIELD)
        return cls(ctx, port=port, host=host, max_runs=max_runs, **tls)

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` the server listens on; the real port once open() has run."""
        if self._server is not None:
            return self._host, int(self._server.server_address[1])
        return self._host, self._port

    def open(self) -> None:
        """Start serving (idempotent). An address that cannot be listened on (in use, not an
        address of this machine) raises ConfigError naming ``port`` or ``host``."""
        if self._server is not None:
            return
        # The server reads its app at every request. A registry passed in may hold collectors
        # of its own, so it is served by prometheus_client as it stands.
        metrics = metrics_app(self.exposition, self._plain) if self._own_registry else self._plain
        app = with_discovery(metrics, self._ctx.scrape_targets)
        self._server = start_server(
            self._host, self._port, app, self._certfile, self._keyfile, field=FIELD
        )

    def write(self, record: StepRecord) -> None:
        """Keep the step's values for the next scrape; never touches the network."""
        with self._lock:
            self._version += 1
            run = self._runs.pop(record.run, None) or _Run()
            self._runs[record.run] = run  # re-inserted: dict order is least recently written first
            while len(self._runs) > self._max_runs:
                evicted = next(iter(self._runs))
                del self._runs[evicted]
                self._warn_once(
                    f"evict:{evicted}",
                    "prometheus: max_runs=%d reached; dropped run %r from /metrics",
                    self._max_runs,
                    evicted,
                )
            if record.step >= run.step:
                run.step, run.time = record.step, record.time
                run.ranks, run.partial = record.ranks, record.partial
            for name, value in record.metrics.items():
                if name not in REPLACED:
                    run.values[name] = (float(value), record.roles.get(name, ""))
            run.totals.add(record.metrics, record.roles)
            if record.nonfinite:
                run.totals.add_nonfinite(record.nonfinite, record.roles)
            if record.distributions:
                run.dists.add(record.distributions, record.metrics, record.roles)

    def forget(self, run: str) -> None:
        """The collector forgot ``run`` (``run_retention_s`` after it ended): its series leave
        /metrics, as a target drops the series of what no longer exists (Prometheus marks
        them stale; their history stays in Prometheus)."""
        with self._lock:
            if self._runs.pop(run, None) is not None:
                self._version += 1
        self._warned.discard(f"evict:{run}")

    def close(self) -> None:
        """Stop serving; safe to call twice or before open()."""
        server, self._server = self._server, None
        if server is not None:
            server.close()

    # --- rendering, called by the HTTP server's threads on every scrape ---

    def exposition(self, encoder: Encoder, content_type: str) -> bytes:
        """The body of /metrics in one format (``choose_encoder``): the same bytes as
        ``encoder(self.registry)``, from text kept since the parts last changed."""
        health = self._health_part()
        steps = self._steps_part(health.names)
        reads, process = self._process.current()
        parts = [
            ("runs", steps.key, steps.runs),
            # One part per family: most scrapes see one or two health counters grow.
            *((f"health {data[0]}", data, [family]) for data, family in health.families),
            ("metrics", steps.key, steps.metrics),
            ("process", reads, process),
        ]
        with self._render_lock:
            return self._texts.join(encoder, content_type, parts)

    def families(self) -> Iterator[Metric]:
        """The metric families of /metrics: run state, health, then every metric."""
        health = self._health_part()
        steps = self._steps_part(health.names)
        yield from steps.runs
        yield from (family for _, family in health.families)
        yield from steps.metrics

    def _steps_part(self, health_names: frozenset[str]) -> _Steps:
        """The families of the written steps, built again only after a write (or when the
        health names they must yield to change)."""
        with self._render_lock:
            with self._lock:
                key = (self._version, health_names)
                if self._steps is not None and self._steps.key == key:
                    return self._steps
                runs = {
                    name: (r.step, r.time, r.ranks, r.partial, dict(r.values), r.totals.copy())
                    for name, r in self._runs.items()
                }
                dists = {n: r.dists.copy() for n, r in self._runs.items() if r.dists.counts}
            # Built outside _lock: write() goes on meanwhile, and the next scrape sees its step.
            taken: dict[str, str] = {}  # Prometheus name -> what owns it
            run_families = list(run_families_of(runs, taken))
            taken.update(dict.fromkeys(health_names, "rlpulse"))
            metrics = list(self._metric_families(runs, taken))
            totals = {run: state[5] for run, state in runs.items()}
            for family in total_families(totals):
                taken.setdefault(family.name, "rlpulse")
                metrics.append(family)
            nonfinite = nonfinite_family(totals, self._prom_of)
            if nonfinite is not None and nonfinite.name not in taken:
                taken[nonfinite.name] = "rlpulse"
                metrics.append(nonfinite)
            for family in dist_families(dists):
                if family.name not in taken:  # a name clash is warned about by the metrics above
                    taken[family.name] = "rlpulse"
                    metrics.append(family)
            self._steps = _Steps(key, run_families, metrics)
            return self._steps

    def _health_part(self) -> _Health:
        """The health families of the collector's snapshot now, each built again only when
        one of its values changed."""
        snapshot = self._health_data()  # outside the lock: it asks the daemon
        families = []
        with self._render_lock:
            for data in snapshot:
                held = self._health.get(data[0])
                if held is None or held[0] != data:
                    held = self._health[data[0]] = (data, make_family(*data))
                families.append(held)
        return _Health(tuple(families), frozenset(data[0] for data, _ in families))

    def _health_data(self) -> tuple[FamilyData, ...]:
        try:
            health = dict(self._ctx.health())
        except Exception:  # a broken snapshot must not take the training metrics down with it
            self._warn_once(
                "health", "prometheus: the collector health snapshot failed", exc_info=True
            )
            health = {}
        server = self._server  # its counters, at 0 before it serves
        health.update(server.stats() if server else {m.key: 0 for m in HTTP_METRICS})
        return health_data(health)

    def _metric_families(
        self, runs: Mapping[str, tuple], taken: dict[str, str]
    ) -> Iterator[Metric]:
        families: dict[str, Family] = {}
        logged = {name for state in runs.values() for name in state[4]}
        names = sorted(logged | (self._counters - REPLACED)) if runs else []
        for name in names:
            pm = self._prom_of(name)
            owner = taken.setdefault(pm.name, pm.name if pm.labels else name)
            if owner != (pm.name if pm.labels else name):
                self._warn_once(
                    f"clash:{name}",
                    "prometheus: %r and %r both map to %s; exporting %r only",
                    owner,
                    name,
                    pm.name,
                    owner,
                )
                continue
            family = families.get(pm.name)
            if family is None:
                label_names = ["run", "role", *(k for k, _ in pm.labels)]
                family = families[pm.name] = make_family(pm.name, pm.help, pm.kind, label_names, [])
            extra = [v for _, v in pm.labels]
            for run, state in sorted(runs.items()):
                if name in state[4]:
                    value, role = state[4][name]
                    family.add_metric([run, role, *extra], value * pm.scale)
                elif name in self._counters:  # not grown yet; derived, so no role
                    family.add_metric([run, "", *extra], 0.0)
        yield from families.values()

    def _prom_of(self, name: str) -> PromMetric:
        """``name``'s Prometheus form (:func:`prom_metric`), worked out once."""
        pm = self._prom.get(name)
        if pm is None:
            pm = self._prom[name] = prom_metric(name, self._ctx.catalog)
        return pm

    def _warn_once(self, key: str, msg: str, *args: Any, exc_info: bool = False) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(msg, *args, exc_info=exc_info)


__all__ = ["PrometheusSink"]
