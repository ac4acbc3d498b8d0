"""Collectors on Ray: a relay on every node, pinned there, and a root above them.

The driver of a Ray job starts them once, before its workers::

    from collector.onray import RayCollectors, RayCollectorsConfig

    collectors = RayCollectors.start(RayCollectorsConfig(root={
        "track_with": ["tensorboard"], "tracker_kwargs": {"tensorboard": {"log_dir": "tb"}},
    }))
    ...  # create workers; each Producer(...) without an address finds its node's relay
    collectors.stop()

Each collector is a Ray actor that runs ``python -m collector`` as its child (it gets SIGTERM
if the actor dies). The root runs on the driver's node and binds that node's IP; a relay runs
on every alive node (``NodeAffinitySchedulingStrategy``, not soft) and binds loopback: only
the workers of its node talk to it, and only the relay-to-root hop crosses the network
(``upstream_curve`` encrypts it). Relays are named actors (``producer.env.relay_actor_name``:
job and node) in the ``rlpulse`` namespace, which is how a producer created without an
address, in the driver or any worker of the job, finds its node's relay
(``producer.env.node_relay_address``); ``RLPULSE_ADDRESS`` still wins when set.

Ray restarts a collector actor that dies (``max_restarts``) on the same node, with the same
``state_dir`` and the same port, so producers reconnect and nothing is lost or repeated.
Nodes that join later get no relay until :meth:`RayCollectors.add_relays` is called again;
their producers must be given the root's address or wait for it.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collector.config import CollectorConfig
from producer.env import RAY_NAMESPACE, relay_actor_name

log = logging.getLogger("rlpulse.collector.onray")
RESTART_WAIT_S = 60.0
"""How long a restarted collector actor retries binding its saved address."""
ROOT_NAME = "root-{job_id}"
"""The root collector's actor name in the ``rlpulse`` namespace."""


@dataclass(frozen=True)
class RayCollectorsConfig:
    """Where and how the collectors of a Ray job run.

    * ``root``: the root's collector config, in its YAML form (``track_with``,
      ``tracker_kwargs``, ``grace_s``...). ``bind`` is set here from ``root_port``.
    * ``relay``: settings for every relay (``grace_s``, ``liveness_s``...); ``upstream``,
      ``bind``, ``state_dir`` and the trackers (none) are set here.
    * ``root_port``: the root's TCP port on its node's IP (0: any free one).
    * ``state_root``: a directory on every node under which each collector keeps its
      ``state_dir`` (by job and node); default: the system temp directory.
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

    def root_config(self, state_dir: str) -> CollectorConfig:
        """The root's config, checked (a bad one raises ConfigError naming the field)."""
        root = dict(self.root)
        if root.get("state_dir") is None:
            root["state_dir"] = state_dir
        return CollectorConfig.from_mapping(root)

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
        from collector.launch import start_collector

        state = Path(config["state_dir"])
        state.mkdir(parents=True, exist_ok=True)
        saved = state / "address"
        bind = saved.read_text().strip() if saved.exists() else f"tcp://{host}:{port or '*'}"
        self._log = (state / "collector.log").open("a")
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

    def stop(self) -> int:
        """SIGTERM and wait: open steps are forwarded (a relay) or written (the root)."""
        return self.handle.stop()


@dataclass
class RayCollectors:
    """The running collectors of a Ray job: the root's address, and each node's relay."""

    config: RayCollectorsConfig
    root: Any
    root_address: str
    relays: dict[str, Any] = field(default_factory=dict)
    """Relay actor handles by Ray node id."""
    relay_addresses: dict[str, str] = field(default_factory=dict)

    @classmethod
    def start(cls, config: RayCollectorsConfig | None = None) -> RayCollectors:
        """Start the root on this (the driver's) node, then a relay on every alive node.
        Call after ``ray.init``; raises ConfigError for a bad config before starting any."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        config = config or RayCollectorsConfig()
        context = ray.get_runtime_context()
        job, node = context.get_job_id(), context.get_node_id()
        root_state = _state_dir(config, job, "root")
        checked = config.root_config(root_state)
        config.relay_config("tcp://127.0.0.1:1", _state_dir(config, job, "relay"))
        actor = _actor(config).options(
            name=ROOT_NAME.format(job_id=job),
            namespace=RAY_NAMESPACE,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
        )
        host = ray.util.get_node_ip_address()
        root = actor.remote(checked.to_mapping(), host, config.root_port)
        out = cls(config, root, ray.get(root.address.remote()))
        log.info("rlpulse root collector at %s", out.root_address)
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
            state = _state_dir(self.config, job, f"relay-{node_id[:16]}")
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

    def stop(self) -> None:
        """Stop the relays first (they forward what they hold), then the root."""
        import ray

        codes = ray.get([relay.stop.remote() for relay in self.relays.values()])
        if any(codes):
            log.warning("relays exited with codes %s", codes)
        code = ray.get(self.root.stop.remote())
        for actor in [*self.relays.values(), self.root]:
            ray.kill(actor, no_restart=True)
        if code:
            log.warning("the root collector exited with code %s", code)


def _actor(config: RayCollectorsConfig) -> Any:
    import ray

    return ray.remote(num_cpus=config.num_cpus, max_restarts=config.max_restarts)(CollectorActor)


def _state_dir(config: RayCollectorsConfig, job: str, name: str) -> str:
    """Per job and collector, under ``state_root`` (each node has its own disk)."""
    base = Path(config.state_root or tempfile.gettempdir()) / "rlpulse-ray" / job
    return str(base / name)
