"""Prometheus sink: serves ``/metrics`` with the latest aggregated value of every metric.

``write()`` only stores the step's values; a custom ``prometheus_client`` collector renders
fresh metric families from them on each scrape (names from :func:`rlpulse.collector.promnames.prom_metric`,
labels ``run`` and ``role``), together with the collector's own health counters. A metric that
a step does not report keeps its last value, as a gauge should. Histograms (``serve/latency``)
are real Prometheus histograms and the server's errors are counters by kind, summed over every
step the sink has written (``promexport.Totals``): a scrape sees cumulative counts, never one
reporting window's. Counters exist before their
first increment: every rejection reason (``rlpulse.schemas.errors.REJECT_REASONS``) from start-up,
and each run's cumulative catalog metrics (``system/tokens``, ``system/samples``) from its
first step, at 0.

Per-rank series are not exported: a :class:`~rlpulse.schemas.record.StepRecord` carries only values
pooled across ranks. The same server answers ``GET /sd``: the ``/metrics`` endpoints producers
registered, for Prometheus' HTTP service discovery (``rlpulse.collector.discovery``).

>>> from prometheus_client import generate_latest
>>> sink = PrometheusSink.from_kwargs({"port": 0}, SinkContext())
>>> sink.open()
>>> sink.write(StepRecord(run="r1", step=3, metrics={"time/rollout": 2.5}))
>>> b"rlpulse_time_rollout_seconds" in generate_latest(sink.registry)
True
>>> sink.close()
"""

from __future__ import annotations

import errno
import logging
import ssl
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlpulse.collector.discovery import with_discovery
from rlpulse.collector.health import MALFORMED, PRODUCER_DROPPED, SINK_METRICS, Health
from rlpulse.collector.promnames import PromMetric, prom_metric
from rlpulse.collector.sinks.base import Sink, SinkContext, reject_unknown
from rlpulse.schemas.errors import REJECT_REASONS, ConfigError
from rlpulse.schemas.record import StepRecord

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

# This module is imported only when a prometheus tracker is configured (collector.sinks.SINKS);
# a missing library becomes a ConfigError with the install hint in from_kwargs.
try:
    from prometheus_client import CollectorRegistry, make_wsgi_app, start_http_server
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.metrics_core import Metric

    from rlpulse.collector.sinks.promdist import DistTotals, dist_families
    from rlpulse.collector.sinks.promexport import (
        REPLACED,
        ProcessSnapshot,
        Totals,
        make_family,
        number,
        total_families,
    )
except ImportError:  # pragma: no cover - exercised only without the optional dependency
    CollectorRegistry = None  # type: ignore[assignment,misc]

log = logging.getLogger(__name__)

FIELD = "tracker_kwargs.prometheus"
_KEYS = ("host", "port", "certfile", "keyfile", "max_runs")
DEFAULT_HOST = "127.0.0.1"
"""Loopback: /metrics is reachable from other machines only when ``host`` says so."""
DEFAULT_MAX_RUNS = 16

_RUN_STEP = ("rlpulse_run_step", "Latest step emitted for the run.")
_RUN_TIME = (
    "rlpulse_run_step_timestamp_seconds",
    "Producers' wall-clock end of the run's latest step (Unix time).",
)
_RUN_RANKS = ("rlpulse_run_ranks", "Producers whose data is in the run's latest step.")
_RUN_PARTIAL = (
    "rlpulse_run_step_partial",
    "1 when the run's latest step was emitted without every rank.",
)


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


class PrometheusSink(Sink):
    """Serves the latest step values and collector health at ``http(s)://host:port/metrics``,
    and the registered endpoints for service discovery at ``/sd``.

    kwargs: ``port`` (required; 0 picks a free one, see :attr:`address`), ``host`` (default
    ``127.0.0.1``), ``certfile`` and ``keyfile`` (TLS, both or neither), ``max_runs`` (runs kept,
    least recently written dropped first; default 16).

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
        self.registry = registry if registry is not None else CollectorRegistry()
        self._lock = threading.Lock()
        self._runs: dict[str, _Run] = {}
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
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
        self.registry.register(_StepCollector(self))
        self.registry.register(ProcessSnapshot())  # the collector's own CPU and memory

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
            _check_tls(tls["certfile"], tls["keyfile"])
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
        try:
            self._server, self._thread = start_http_server(
                self._port,
                addr=self._host,
                registry=self.registry,
                certfile=self._certfile,
                keyfile=self._keyfile,
            )
        except OSError as exc:
            where = f"{self._host}:{self._port}"
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(
                    f"{FIELD}.port",
                    f"cannot listen on {where}: the port is already in use",
                    self._port,
                ) from None
            raise ConfigError(
                f"{FIELD}.host", f"cannot listen on {where}: {exc.strerror or exc}", self._host
            ) from None
        # The server already runs; it reads its app at every request.
        app = with_discovery(make_wsgi_app(self.registry), self._ctx.scrape_targets)
        self._server.set_app(app)

    def write(self, record: StepRecord) -> None:
        """Keep the step's values for the next scrape; never touches the network."""
        with self._lock:
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
            if record.distributions:
                run.dists.add(record.distributions, record.metrics, record.roles)

    def close(self) -> None:
        """Stop serving; safe to call twice or before open()."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=5)

    # --- rendering, called by the HTTP server's thread on every scrape ---

    def families(self) -> Iterator[Metric]:
        """Fresh metric families for one scrape: run state, health, then every metric."""
        with self._lock:
            runs = {
                name: (r.step, r.time, r.ranks, r.partial, dict(r.values), r.totals.copy())
                for name, r in self._runs.items()
            }
            dists = {name: r.dists.copy() for name, r in self._runs.items() if r.dists.counts}
        taken: dict[str, str] = {}  # Prometheus name -> what owns it
        yield from self._run_families(runs, taken)
        yield from self._health_families(taken)
        yield from self._metric_families(runs, taken)
        for family in total_families({run: state[5] for run, state in runs.items()}):
            taken.setdefault(family.name, "rlpulse")
            yield family
        for family in dist_families(dists):
            if family.name not in taken:  # a name clash is warned about by the metrics above
                taken[family.name] = "rlpulse"
                yield family

    def _run_families(self, runs: Mapping[str, tuple], taken: dict[str, str]) -> Iterator[Metric]:
        specs = (_RUN_STEP, _RUN_TIME, _RUN_RANKS, _RUN_PARTIAL)
        for index, (pname, help_) in enumerate(specs):
            family = GaugeMetricFamily(pname, help_, labels=["run"])
            for run, state in sorted(runs.items()):
                family.add_metric([run], float(state[index]))
            taken[pname] = "rlpulse"
            yield family

    def _health_families(self, taken: dict[str, str]) -> Iterator[Metric]:
        try:
            health = dict(self._ctx.health())
        except Exception:  # a broken snapshot must not take the training metrics down with it
            self._warn_once(
                "health", "prometheus: the collector health snapshot failed", exc_info=True
            )
            health = {}
        for metric in (*Health.declared(), PRODUCER_DROPPED):
            value = number(health.get(metric.key))
            if value is not None:
                taken[metric.name] = "rlpulse"
                yield make_family(metric.name, metric.help, metric.kind, [], [([], value)])
        malformed = health.get(MALFORMED.key)
        if isinstance(malformed, Mapping):
            # Every known reason from the start, at 0 until it occurs: increase() and the
            # malformed-messages alert need a series before the first reject to see it.
            counts = dict.fromkeys(REJECT_REASONS, 0.0)
            counts.update((str(k), v) for k, v in malformed.items() if number(v) is not None)
            taken[MALFORMED.name] = "rlpulse"
            yield make_family(
                MALFORMED.name,
                MALFORMED.help,
                MALFORMED.kind,
                ["reason"],
                [([reason], float(v)) for reason, v in sorted(counts.items())],
            )
        sinks = health.get("sinks")
        if isinstance(sinks, Mapping):
            for metric in SINK_METRICS:
                samples = []
                for sink_name, stats in sorted(sinks.items()):
                    value = number(stats.get(metric.key)) if isinstance(stats, Mapping) else None
                    if value is not None:
                        samples.append(([str(sink_name)], value))
                taken[metric.name] = "rlpulse"
                yield make_family(metric.name, metric.help, metric.kind, ["sink"], samples)

    def _metric_families(
        self, runs: Mapping[str, tuple], taken: dict[str, str]
    ) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        logged = {name for state in runs.values() for name in state[4]}
        names = sorted(logged | (self._counters - REPLACED)) if runs else []
        for name in names:
            pm = self._prom.get(name)
            if pm is None:
                pm = self._prom[name] = prom_metric(name, self._ctx.catalog)
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

    def _warn_once(self, key: str, msg: str, *args: Any, exc_info: bool = False) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(msg, *args, exc_info=exc_info)


class _StepCollector:
    """The ``prometheus_client`` collector: one ``collect()`` that asks the sink each scrape."""

    def __init__(self, sink: PrometheusSink) -> None:
        self._sink = sink

    def collect(self) -> Iterable[Metric]:
        return list(self._sink.families())

    def describe(self) -> Iterable[Metric]:
        return []  # names depend on what producers log; nothing to check at registration


def _check_tls(certfile: str, keyfile: str) -> None:
    """Load the pair as the server will, so a wrong file fails at start-up naming the field."""
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(certfile, keyfile)
    except ssl.SSLError as exc:
        try:  # the usual mistake, worth saying so
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(keyfile, certfile)
        except ssl.SSLError:
            raise ConfigError(
                f"{FIELD}.certfile",
                f"cannot load the certificate {certfile!r} with the private key {keyfile!r} "
                f"({exc.reason or exc}): certfile must hold the PEM certificate and keyfile "
                "its private key",
            ) from None
        raise ConfigError(
            f"{FIELD}.certfile",
            f"certfile and keyfile are swapped: {certfile!r} holds the private key and "
            f"{keyfile!r} the certificate",
        ) from None


__all__ = ["PrometheusSink"]
