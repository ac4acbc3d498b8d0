"""Collectors on Ray: a relay on every node, pinned there, and a root above them.

The driver of a Ray job starts them once, before its workers::

    from rlpulse.collector.onray import RayCollectors, RayCollectorsConfig

    collectors = RayCollectors.start(RayCollectorsConfig(root={
        "track_with": ["tensorboard"], "tracker_kwargs": {"tensorboard": {"log_dir": "tb"}},
    }))
    ...  # create workers; each Producer(...) without an address finds its node's relay
    collectors.stop()  # relays forward what they hold, then the root writes it all

Each collector is a Ray actor that runs ``python -m rlpulse.collector`` as its child (it gets SIGTERM
if the actor dies). The root runs on the driver's node and binds that node's IP; a relay runs
on every alive node (``NodeAffinitySchedulingStrategy``, not soft) and binds loopback: only
the workers of its node talk to it, and only the relay-to-root hop crosses the network
(``upstream_curve`` encrypts it). Relays are named actors (``rlpulse.producer.env.relay_actor_name``:
job and node) in the ``rlpulse`` namespace, which is how a producer created without an
address, in the driver or any worker of the job, finds its node's relay
(``rlpulse.producer.env.node_relay_address``); ``RLPULSE_ADDRESS`` still wins when set.

Each :meth:`RayCollectors.start` is an *attempt* with an id of its own: the collectors keep
their ``state_dir`` under ``state_root/rlpulse-ray/<job>-<attempt>/``, never under the Ray job
id alone, which every fresh local Ray cluster reuses (``01000000``). Ray restarts a collector
actor that dies (``max_restarts``) on the same node, with the same ``state_dir`` and the same
port, so producers reconnect and nothing is lost or repeated. :meth:`RayCollectors.stop` is
the end of the job: relays forward everything they hold, then the root emits every open step
(partial where ranks are missing) and writes it, within a timeout; what it left is reported.
Nodes that join later get no relay until :meth:`RayCollectors.add_relays` is called again;
their producers must be given the root's address or wait for it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlpulse.collector.config import CollectorConfig
from rlpulse.wire.rendezvous import RAY_NAMESPACE, relay_actor_name

log = logging.getLogger("rlpulse.collector.onray")
RESTART_WAIT_S = 60.0
"""How long a restarted collector actor retries binding its saved address."""
ROOT_NAME = "root-{job_id}"
"""The root collector's actor name in the ``rlpulse`` namespace."""
ACTOR_MARGIN_S = 30.0
"""Beyond a stop's timeout, how long to wait for a collector actor's answer (Ray's own
latency) before counting it as killed."""


@dataclass(frozen=True)
class RayCollectorsConfig:
    """Where and how the collectors of a Ray job run.

    * ``root``: the root's collector config, in its YAML form (``track_with``,
      ``tracker_kwargs``, ``grace_s``...). ``bind`` is set here from ``root_port``; relative
      paths (a jsonl ``path``) are taken from the driver's working directory.
    * ``relay``: settings for every relay (``grace_s``, ``liveness_s``...); ``upstream``,
      ``bind``, ``state_dir`` and the trackers (none) are set here.
    * ``root_port``: the root's TCP port on its node's IP (0: any free one).
    * ``state_root``: a directory on every node under which each collector keeps its
      ``state_dir`` (by job, attempt and node); default: the system temp directory.
    * ``num_cpus``: the CPUs each collector actor reserves in Ray's accounting (0: none, so
      collectors never take a worker's slot; they use about one core under load).
    * ``max_restarts``: how often Ray restarts a collector actor that died (-1: always).
    """

    root: Mapping[str, Any] = field(default_factory=lambda: {"track_with": ["stdout"]})
    relay: Mapping[str, Any] = field(default_factory=dict)
    root_port: int = 0
    state_root: str | None = None
    num_cpus: float = 0.0
    max_restarts: int = -1

    def root_config(self, state_dir: str, base: str | None = None) -> CollectorConfig:
        """The root's config, checked (a bad one raises ConfigError naming the field), its
        relative paths under ``base`` (default: this process's working directory)."""
        root = dict(self.root)
        if root.get("state_dir") is None:
            root["state_dir"] = state_dir
        return CollectorConfig.from_mapping(root).placed_under(base or os.getcwd())

    def relay_config(self, upstream: str, state_dir: str) -> CollectorConfig:
        settings = dict(self.relay)
        return CollectorConfig.from_mapping(
            {**settings, "upstream": upstream, "state_dir": state_dir, "track_with": []}
        )


class CollectorActor:
    """A Ray actor running one collector daemon as its child process. The collector's
    address (its bound port) is kept in its ``state_dir``, so a restarted actor binds the
    same one and producers reconnect to it."""

    def __init__(self, config: Mapping[str, Any], host: str, port: int) -> None:
        from rlpulse.collector.launch import start_collector

        self.state = Path(config["state_dir"])
        self.state.mkdir(parents=True, exist_ok=True)
        saved = self.state / "address"
        bind = saved.read_text().strip() if saved.exists() else f"tcp://{host}:{port or '*'}"
        self._log = (self.state / "collector.log").open("a")
        deadline = time.monotonic() + RESTART_WAIT_S
        while True:  # a restart: the collector it replaces may still hold the port a moment
            try:
                self.handle = start_collector(
                    config, bind=bind, stdout=self._log, stderr=self._log, die_with_parent=True
                )
                break
            except RuntimeError:
                if not saved.exists() or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        saved.write_text(self.handle.address)

    def address(self) -> str:
        return self.handle.address

    def pid(self) -> int:
        return self.handle.proc.pid

    def finish(self, timeout_s: float) -> dict[str, Any]:
        """Stop the collector for good (SIGUSR1: a relay forwards what it holds, the root
        emits its open steps and writes them) and wait up to ``timeout_s``, then SIGKILL.
        Returns its exit code (None: killed) and its ``stopped.json`` report."""
        report = self.state / "stopped.json"
        report.unlink(missing_ok=True)  # a previous stop's (before a restart)
        proc = self.handle.proc
        if proc.poll() is None:
            proc.send_signal(signal.SIGUSR1)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                return {"code": None, "report": {}}
        data = json.loads(report.read_text()) if report.exists() else {}
        return {"code": proc.returncode, "report": data}


@dataclass(frozen=True)
class CollectorStop:
    """How one collector of :meth:`RayCollectors.stop` ended: ``code`` is its exit status
    (None: it did not exit within the timeout and was killed), ``report`` what it said it
    left (``stopped.json``: ``unwritten`` records per sink, ``open_steps``, and its counts
    ``steps_emitted``, ``partial_steps``, ``late``)."""

    name: str
    state_dir: str
    code: int | None
    report: Mapping[str, Any]

    def left(self) -> list[str]:
        """What it did not forward or write, in words (empty when it left nothing)."""
        where = f"kept in {self.state_dir} (see its collector.log)"
        if self.code is None:
            return [f"{self.name} did not stop in time and was killed; what it held is {where}"]
        out = []
        if self.code != 0:
            out.append(f"{self.name} exited with code {self.code}; {where}")
        for sink, count in sorted(self.report.get("unwritten", {}).items()):
            what = "forwarded to the root" if sink == "upstream" else f"written by sink {sink}"
            out.append(f"{self.name}: {count} records not {what}; {where}")
        if self.report.get("open_steps"):
            out.append(f"{self.name}: {self.report['open_steps']} open steps {where}")
        return out


@dataclass(frozen=True)
class StopReport:
    """What :meth:`RayCollectors.stop` did: every collector's :class:`CollectorStop`, the
    root's last. ``left`` lists what was not forwarded or written (empty: everything was).

    >>> # report = collectors.stop(); assert not report.left, report.left
    """

    collectors: tuple[CollectorStop, ...] = ()

    @property
    def left(self) -> list[str]:
        return [line for c in self.collectors for line in c.left()]

    @property
    def root(self) -> CollectorStop | None:
        return self.collectors[-1] if self.collectors else None


@dataclass
class RayCollectors:
    """The running collectors of a Ray job: the root's address, and each node's relay.

    ``attempt`` is unique to this :meth:`start` (a Ray job id is not: every fresh local Ray
    cluster's first job is ``01000000``): the collectors keep their state under
    ``state_root/rlpulse-ray/<job>-<attempt>/``, so a later run never inherits it.
    """

    config: RayCollectorsConfig
    root: Any
    root_address: str
    attempt: str = ""
    state_dir: str = ""
    """This attempt's directory: ``root/`` and one ``relay-<node>/`` per node."""
    relays: dict[str, Any] = field(default_factory=dict)
    """Relay actor handles by Ray node id."""
    relay_addresses: dict[str, str] = field(default_factory=dict)
    stopped: StopReport | None = None
    """Set by :meth:`stop`."""

    @classmethod
    def start(cls, config: RayCollectorsConfig | None = None) -> RayCollectors:
        """Start the root on this (the driver's) node, then a relay on every alive node.
        Call after ``ray.init``; raises ConfigError for a bad config before starting any.
        Relative paths in the root's config are taken from the driver's working directory."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        config = config or RayCollectorsConfig()
        context = ray.get_runtime_context()
        job, node = context.get_job_id(), context.get_node_id()
        attempt = uuid.uuid4().hex[:12]
        state_dir = _state_dir(config, f"{job}-{attempt}")
        checked = config.root_config(str(Path(state_dir, "root")))
        config.relay_config("tcp://127.0.0.1:1", str(Path(state_dir, "relay")))
        actor = _actor(config).options(
            name=ROOT_NAME.format(job_id=job),
            namespace=RAY_NAMESPACE,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
        )
        host = ray.util.get_node_ip_address()
        root = actor.remote(checked.to_mapping(), host, config.root_port)
        out = cls(config, root, ray.get(root.address.remote()), attempt, state_dir)
        log.info("rlpulse root collector at %s; state in %s", out.root_address, state_dir)
        out.add_relays()
        return out

    def add_relays(self) -> dict[str, str]:
        """Start a relay on every alive node that has none (nodes that joined since); returns
        the addresses of the new ones by node id."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        job = ray.get_runtime_context().get_job_id()
        started = {}
        for node in ray.nodes():
            node_id = node["NodeID"]
            if not node["Alive"] or node_id in self.relays:
                continue
            state = str(Path(self.state_dir, f"relay-{node_id[:16]}"))
            settings = self.config.relay_config(self.root_address, state).to_mapping()
            actor = _actor(self.config).options(
                name=relay_actor_name(job, node_id),
                namespace=RAY_NAMESPACE,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            )
            self.relays[node_id] = actor.remote(settings, "127.0.0.1", 0)
            started[node_id] = self.relays[node_id].address.remote()
        addresses = dict(zip(started, ray.get(list(started.values())), strict=True))
        self.relay_addresses.update(addresses)
        return addresses

    def stop(self, timeout_s: float = 60.0) -> StopReport:
        """Forward and write everything, then end the actors; safe to call twice.

        The relays first, together: each forwards its open steps to the root (with the ranks
        that finished them) and waits for the root's acknowledgements. Then the root emits
        every open step, flagged partial where ranks are missing, and writes it to its
        trackers. Each tier gets ``timeout_s``; a collector still running then is killed.
        What was not forwarded or written is logged as a warning and listed in the returned
        report's ``left`` (it stays in ``state_dir``)."""
        import ray

        if self.stopped is not None:
            return self.stopped
        pending = [
            self._finish(f"relay on node {node[:16]}", actor, f"relay-{node[:16]}", timeout_s)
            for node, actor in self.relays.items()
        ]
        relays = [wait() for wait in pending]  # every relay was signalled before any wait
        root = self._finish("root", self.root, "root", timeout_s)()
        for actor in [*self.relays.values(), self.root]:
            ray.kill(actor, no_restart=True)
        self.stopped = StopReport((*relays, root))
        for line in self.stopped.left:
            log.warning("rlpulse: %s", line)
        r = root.report
        if root.code == 0 and r:
            log.info(
                "rlpulse collectors stopped: the root emitted %d steps (%d partial, %d late)",
                r.get("steps_emitted", 0),
                r.get("partial_steps", 0),
                r.get("late", 0),
            )
        return self.stopped

    def _finish(
        self, name: str, actor: Any, subdir: str, timeout_s: float
    ) -> Callable[[], CollectorStop]:
        """Ask ``actor`` to finish now; the returned call waits for its answer."""
        import ray

        ref = actor.finish.remote(timeout_s)
        state = str(Path(self.state_dir, subdir))

        def wait() -> CollectorStop:
            try:
                answer = ray.get(ref, timeout=timeout_s + ACTOR_MARGIN_S)
            except (ray.exceptions.GetTimeoutError, ray.exceptions.RayError):
                return CollectorStop(name, state, None, {})
            return CollectorStop(name, state, answer["code"], answer["report"])

        return wait


def _actor(config: RayCollectorsConfig) -> Any:
    import ray

    return ray.remote(num_cpus=config.num_cpus, max_restarts=config.max_restarts)(CollectorActor)


def _state_dir(config: RayCollectorsConfig, attempt: str) -> str:
    """This attempt's directory under ``state_root`` (each node has its own disk)."""
    return str(Path(config.state_root or tempfile.gettempdir()) / "rlpulse-ray" / attempt)
