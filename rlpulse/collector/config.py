"""Collector configuration: one frozen dataclass, loaded from YAML and validated up front.

Two tracker forms are accepted. ROLL's, with one tracker and its kwargs::

    track_with: tensorboard
    tracker_kwargs:
      log_dir: /path/to/tensorboard/logs

and a list of trackers, with ``tracker_kwargs`` keyed by tracker name::

    track_with: [stdout, jsonl, tensorboard]
    tracker_kwargs:
      jsonl: {path: runs/out.jsonl}
      tensorboard: {log_dir: runs/tb}

Unknown keys and bad values raise :class:`ConfigError` naming the field.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from rlpulse.collector.output.discovery import TargetPolicy
from rlpulse.collector.sinks import SINKS, sink_class
from rlpulse.schemas.attribution import DEFAULT_MARGIN
from rlpulse.schemas.errors import ConfigError
from rlpulse.schemas.messages import DEFAULT_LIMITS
from rlpulse.wire.rendezvous import DEFAULT_ADDRESS

DEFAULT_BIND = DEFAULT_ADDRESS
"""Where the collector listens by default: the address producers use by default."""
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


@dataclass(frozen=True)
class CollectorConfig:
    """Everything the daemon needs.

    * ``bind``: ZeroMQ endpoint; loopback unless asked otherwise.
    * ``trackers``: tracker name -> kwargs, in fan-out order.
    * ``grace_s``: once some rank has finished a step, how long to wait for the others before
      emitting it flagged partial.
    * ``settle_s``: a new run's steps wait this long after its first registration for other
      roles to register, unless a producer declared the run's roles (``expected_roles``).
    * ``liveness_s``: a producer silent this long (heartbeats stopped) is presumed dead; the
      steps it has not finished are emitted partial without waiting out the grace period.
      A relay below is presumed dead (its ranks gone) only when silent for the longer of
      ``grace_s`` and ``liveness_s`` (``rlpulse.collector.tiers.watch``).
    * ``run_retention_s``: a run that has ended (no open step, every producer said goodbye or
      is presumed gone) is kept this long, then forgotten: its state leaves memory, the
      checkpoint, the sinks' cursors and ``/metrics``; a compact tombstone keeps late data of
      it counted as late (``rlpulse.collector.runs.retention``).
    * ``max_open_steps``: open steps per run; producers that would open more are held back
      (unacknowledged, asked again once steps are emitted); past 8 times as many (a batch
      overshooting the window), the oldest is emitted partial.
    * ``tps_window``: steps pooled for ``system/tps`` (1: this step alone; ROLL uses 5).
    * ``max_message_bytes``: larger messages are rejected (ZeroMQ cuts the connection of one
      above 64 KiB more than this or than 8 MiB, whichever is larger).
    * ``sink_queue``: steps buffered per sink before that sink starts dropping.
    * ``sink_retries``: attempts per step for a failing sink, with backoff in between.
    * ``sink_close_s``: time each sink gets to flush and close at shutdown.
    * ``state_dir``: where the write-ahead log, the outbox of emitted steps and the sinks'
      cursors live. With it, a crash or restart loses nothing that was acknowledged, and a
      failing sink catches up later; without it, state is in memory only.
    * ``fsync``: also fsync the logs before acknowledging (survives power loss, not only a
      crash of the collector; costs a disk flush per receive batch).
    * ``max_names_per_entry``, ``max_name_length``, ``max_names_per_run``: input limits (a
      cardinality bomb must not take memory without bound).
    * ``curve``: CurveZMQ encryption and authentication, ``{server_cert: <server>.key_secret,
      clients_dir: <folder of allowed clients' .key files>}`` (``python -m rlpulse.collector keygen``).
    * ``upstream``: makes this collector a *relay* (``rlpulse.collector.tiers.relay``): it merges its own
      ranks' states per step and forwards them, as states, to the collector at this address,
      which merges the relays again. A relay has no trackers. ``upstream_curve``:
      ``{server_key: <above>.key, client_cert: <relay>.key_secret}`` when the collector above
      runs CurveZMQ.
    * ``sd_targets``: which registered ``/metrics`` endpoints ``/sd`` may list for Prometheus,
      ``{allow: [networks, addresses, host names, "*.suffix"], deny: [...]}``; ``deny``
      defaults to the link-local networks and cloud metadata addresses, ``allow`` to any host
      (``rlpulse.collector.output.discovery.TargetPolicy``).
    * ``ledger_margin``: a step whose wall time is more than this fraction above the run's
      rolling median step of its kind is given a cause in its record
      (``rlpulse.schemas.attribution``; docs/ledger.md).
    """

    bind: str = DEFAULT_BIND
    trackers: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: {"stdout": {}})
    grace_s: float = 60.0
    liveness_s: float = 10.0
    settle_s: float = 2.0
    run_retention_s: float = 3600.0
    max_open_steps: int = 64
    tps_window: int = 1
    max_message_bytes: int = DEFAULT_LIMITS.max_bytes
    sink_queue: int = 1024
    sink_retries: int = 5
    sink_close_s: float = 10.0
    state_dir: str | None = None
    fsync: bool = False
    checkpoint_s: float = 5.0
    segment_bytes: int = 64 * 1024 * 1024
    max_names_per_entry: int = DEFAULT_LIMITS.max_names
    max_name_length: int = DEFAULT_LIMITS.max_name_length
    max_names_per_run: int = 10_000
    curve: Mapping[str, str] | None = None
    log_level: str = "INFO"
    upstream: str | None = None
    upstream_curve: Mapping[str, str] | None = None
    sd_targets: Mapping[str, Any] | None = None
    ledger_margin: float = DEFAULT_MARGIN

    def __post_init__(self) -> None:
        _check_bind(self.bind)
        if self.upstream is not None:
            _check_upstream(self.upstream, self.upstream_curve, self.trackers)
        elif self.upstream_curve is not None:
            raise ConfigError("upstream_curve", "is for a relay: set upstream too")
        elif not self.trackers:
            raise ConfigError(
                "track_with",
                "is empty: with no tracker the collector would discard every step it receives; "
                "name at least one (e.g. [stdout])",
                [],
            )
        if (
            not isinstance(self.settle_s, (int, float))
            or isinstance(self.settle_s, bool)
            or self.settle_s < 0
        ):
            raise ConfigError("settle_s", "must be a non-negative number of seconds", self.settle_s)
        margin = self.ledger_margin
        if (
            not isinstance(margin, (int, float))
            or isinstance(margin, bool)
            or not margin > 0
            or not math.isfinite(margin)
        ):
            raise ConfigError(
                "ledger_margin", "must be a positive fraction of the median step (0.2: 20%)", margin
            )
        for name in ("grace_s", "liveness_s", "sink_close_s", "checkpoint_s", "run_retention_s"):
            value = getattr(self, name)
            if (
                not isinstance(value, (int, float))
                or isinstance(value, bool)
                or not value > 0
                or not math.isfinite(value)
            ):
                raise ConfigError(name, "must be a positive number of seconds", value)
        for name in (
            "max_open_steps",
            "tps_window",
            "max_message_bytes",
            "sink_queue",
            "segment_bytes",
            "max_names_per_entry",
            "max_name_length",
            "max_names_per_run",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(name, "must be a positive integer", value)
        if (
            not isinstance(self.sink_retries, int)
            or isinstance(self.sink_retries, bool)
            or self.sink_retries < 0
        ):
            raise ConfigError("sink_retries", "must be a non-negative integer", self.sink_retries)
        if self.state_dir is not None:
            _check_state_dir(self.state_dir)
        if not isinstance(self.fsync, bool):
            raise ConfigError("fsync", "must be true or false", self.fsync)
        if self.curve is not None:
            _check_curve(self.curve)
        TargetPolicy.from_mapping(self.sd_targets)  # ConfigError names the bad entry
        if not isinstance(self.log_level, str) or self.log_level.upper() not in LOG_LEVELS:
            raise ConfigError(
                "log_level", f"must be one of {', '.join(LOG_LEVELS)}", self.log_level
            )
        for name, kwargs in self.trackers.items():
            if name not in SINKS:
                raise ConfigError(
                    "track_with", f"unknown tracker; choose from {', '.join(sorted(SINKS))}", name
                )
            if not isinstance(kwargs, Mapping):
                raise ConfigError(f"tracker_kwargs.{name}", "must be a mapping", kwargs)

    @property
    def target_policy(self) -> TargetPolicy:
        """``sd_targets`` as the policy ``rlpulse.collector.output.discovery`` applies."""
        return TargetPolicy.from_mapping(self.sd_targets)

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> CollectorConfig:
        if not isinstance(raw, Mapping):
            raise ConfigError("<config>", "must be a YAML mapping", type(raw).__name__)
        data = dict(raw)
        track_with = data.pop("track_with", None)
        if track_with is None and data.get("upstream") is not None:
            track_with = []  # a relay forwards; the collector above it writes
        trackers = _trackers(track_with, data.pop("tracker_kwargs", None))
        known = {f.name for f in fields(cls)} - {"trackers"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(
                unknown[0],
                f"unknown key; known keys are track_with, tracker_kwargs, {', '.join(sorted(known))}",
            )
        return cls(trackers=trackers, **data)

    def to_mapping(self) -> dict[str, Any]:
        """The YAML form (list of trackers, kwargs by tracker) that :meth:`from_mapping`
        reads back to an equal config."""
        out: dict[str, Any] = {
            "track_with": list(self.trackers),
            "tracker_kwargs": {name: dict(kwargs) for name, kwargs in self.trackers.items()},
        }
        for f in fields(self):
            if f.name != "trackers":
                value = getattr(self, f.name)
                out[f.name] = dict(value) if isinstance(value, Mapping) else value
        return out

    def placed_under(self, base: str | Path) -> CollectorConfig:
        """This config with relative paths (``state_dir`` and every tracker's path kwargs,
        the ones its sink lists in ``PATHS``) taken relative to ``base`` instead of the
        working directory: a run's collector writes into the run's directory."""
        root = Path(base)

        def place(value: Any) -> Any:
            if isinstance(value, str) and value and not Path(value).is_absolute():
                return str((root / value).resolve())
            return value

        trackers = {
            name: {k: place(v) if k in sink_class(name).PATHS else v for k, v in kwargs.items()}
            for name, kwargs in self.trackers.items()
        }
        return replace(self, trackers=trackers, state_dir=place(self.state_dir))

    @classmethod
    def load(cls, path: str | Path, bind: str | None = None) -> CollectorConfig:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError("--config", f"cannot read {path}: {exc.strerror}") from None
        try:
            raw = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ConfigError("--config", f"{path} is not valid YAML: {exc}") from None
        if bind is not None and isinstance(raw, dict):
            raw = {**raw, "bind": bind}
        return cls.from_mapping(raw)


def _trackers(track_with: Any, kwargs: Any) -> dict[str, dict[str, Any]]:
    if track_with is None:
        track_with = ["stdout"]
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, Mapping):
        raise ConfigError("tracker_kwargs", "must be a mapping", kwargs)
    if isinstance(track_with, str):  # ROLL's form: one tracker, its kwargs flat
        return {track_with: dict(kwargs)}
    if not isinstance(track_with, list) or not all(isinstance(t, str) for t in track_with):
        raise ConfigError("track_with", "must be a tracker name or a list of names", track_with)
    if len(set(track_with)) != len(track_with):
        raise ConfigError("track_with", "names a tracker twice", track_with)
    extra = sorted(set(kwargs) - set(track_with))
    if extra:
        raise ConfigError(f"tracker_kwargs.{extra[0]}", "has kwargs but is not in track_with")
    out = {}
    for name in track_with:
        sub = kwargs.get(name) or {}
        if not isinstance(sub, Mapping):
            raise ConfigError(f"tracker_kwargs.{name}", "must be a mapping", sub)
        out[name] = dict(sub)
    return out


def _check_curve(curve: object) -> None:
    if not isinstance(curve, Mapping) or set(curve) != {"server_cert", "clients_dir"}:
        raise ConfigError(
            "curve", "must be a mapping with exactly server_cert and clients_dir", curve
        )
    cert, clients = Path(str(curve["server_cert"])), Path(str(curve["clients_dir"]))
    if not cert.is_file():
        raise ConfigError(
            "curve.server_cert",
            "is not a file (make one with `python -m rlpulse.collector keygen`)",
            str(cert),
        )
    if not clients.is_dir():
        raise ConfigError(
            "curve.clients_dir",
            "is not a folder of allowed client public keys (*.key)",
            str(clients),
        )


def _check_upstream(upstream: object, curve: object, trackers: Mapping[str, Any]) -> None:
    """A relay: where it forwards to, the keys for that, and no trackers of its own."""
    if not isinstance(upstream, str) or not upstream.startswith("tcp://"):
        raise ConfigError(
            "upstream", "must be the address of the collector above, as tcp://HOST:PORT", upstream
        )
    host, colon, port = upstream[len("tcp://") :].rpartition(":")
    if not (host and colon and port.isdigit() and 0 < int(port) <= 65535):
        raise ConfigError("upstream", "needs a host and a port in 1-65535", upstream)
    if trackers:
        raise ConfigError(
            "track_with",
            "must be empty for a relay (upstream set): its steps hold only its own ranks; the "
            "collector above writes the merged ones",
            sorted(trackers),
        )
    if curve is not None and (
        not isinstance(curve, Mapping) or set(curve) != {"server_key", "client_cert"}
    ):
        raise ConfigError(
            "upstream_curve", "must be a mapping with exactly server_key and client_cert", curve
        )


def _check_bind(bind: object) -> None:
    """A ZeroMQ endpoint; for ``tcp://`` a port in 0-65535 or ``*`` (libzmq would silently
    take a larger port modulo 65536, and a negative one as well)."""
    if not isinstance(bind, str) or "://" not in bind:
        raise ConfigError("bind", f"must be a ZeroMQ endpoint such as {DEFAULT_BIND}", bind)
    transport, _, address = bind.partition("://")
    if transport != "tcp":
        return
    host, colon, port = address.rpartition(":")
    if not colon or not host:
        raise ConfigError(
            "bind", f"a tcp endpoint needs a host and a port, as in {DEFAULT_BIND}", bind
        )
    if port != "*" and not (port.isascii() and port.isdigit() and int(port) <= 65535):
        raise ConfigError("bind", "port must be from 0 to 65535, or * for any free port", bind)


def _check_state_dir(state_dir: object) -> None:
    """A directory, or a path where one can be created (the daemon creates it at start-up)."""
    if not isinstance(state_dir, str) or not state_dir:
        raise ConfigError("state_dir", "must be a directory path", state_dir)
    path = Path(state_dir)
    if path.exists() and not path.is_dir():
        raise ConfigError("state_dir", "is a file, not a directory", state_dir)
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not path.exists() and not ancestor.is_dir():
        raise ConfigError(
            "state_dir", f"cannot be created: {ancestor} is a file, not a directory", state_dir
        )
    target = path if path.exists() else ancestor
    if not os.access(target, os.W_OK | os.X_OK):
        raise ConfigError("state_dir", f"is not writable ({target})", state_dir)
