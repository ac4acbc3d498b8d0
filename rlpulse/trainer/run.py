"""One training run end to end: collector, warm-start, Ray workers, the driver, clean-up."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import yaml

from rlpulse.runtools.compare import RUN_CONFIG
from rlpulse.schemas.protocol import DROP_KEYS, STAT_KEYS
from rlpulse.schemas.topology import DRIVER
from rlpulse.trainer.config import TrainerConfig, to_dict
from rlpulse.trainer.driver import Driver, RunResult
from rlpulse.trainer.model import build_policy
from rlpulse.trainer.sft import warm_start
from rlpulse.trainer.task import Task, build_task
from rlpulse.trainer.tokenizer import build_tokenizer

log = logging.getLogger("rlpulse.trainer")
FREE_PORT = "tcp://127.0.0.1:*"


@dataclass(frozen=True)
class Claimed:
    """The run a start of the trainer writes: ``cfg`` (its ``run`` possibly a new attempt's
    name) and, when it is one, the name that was already taken."""

    cfg: TrainerConfig
    taken: str | None = None
    resumed: bool = False
    """``--resume`` into a directory an earlier run wrote."""

    def notice(self) -> str | None:
        """What to tell the user when the run was renamed or resumed (None otherwise)."""
        if self.resumed:
            return (
                f"writing into the existing run {self.cfg.run!r} in {self.cfg.run_dir} "
                "(--resume): this run's steps are appended to what its files hold"
            )
        if self.taken is None:
            return None
        return (
            f"run {self.taken!r} already exists in {self.cfg.run_dir.parent / self.taken}: "
            f"this run is a new attempt, {self.cfg.run!r} ({self.cfg.run_dir}); pass --resume "
            f"to add to {self.taken!r} instead"
        )


def claim_run(cfg: TrainerConfig, *, resume: bool = False) -> Claimed:
    """Take the run's directory. One that holds a saved configuration (``config.yaml``, the
    first thing every run writes) belongs to an earlier run of that name, whose
    ``metrics.jsonl`` a second run would append the same steps to: this run becomes a new
    attempt, ``<run>-2`` (``-3``...), the first name free, unless ``resume`` (then it writes
    into the existing directory, appending to its metrics). Files others put there first (a
    collector started by a wrapper script) do not make a directory taken."""
    base = cfg.run_dir
    taken = (base / RUN_CONFIG).exists()
    if resume or not taken:
        base.mkdir(parents=True, exist_ok=True)
        return Claimed(cfg, resumed=taken)
    for attempt in itertools.count(2):
        candidate = replace(cfg, run=f"{cfg.run}-{attempt}")
        try:  # atomic: two trainers started at once get two attempts
            candidate.run_dir.mkdir(parents=True)
        except FileExistsError:
            continue  # even without a config.yaml: someone else's, or a trainer starting now
        return Claimed(candidate, taken=cfg.run)
    raise AssertionError("unreachable")


def save_config(cfg: TrainerConfig) -> Path:
    """Write the resolved configuration (the file with every ``--set`` applied) to the run
    directory as YAML, beside the default ``metrics.jsonl``, where ``rlpulse
    compare`` reads it; ``load_config`` reads it back to the same configuration."""
    path = cfg.run_dir / RUN_CONFIG
    path.write_text(yaml.safe_dump(_plain(to_dict(cfg)), sort_keys=False))
    return path


def _plain(value: Any) -> Any:
    """Configuration values as YAML's plain types (tuples and mappings included)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def initial_weights(cfg: TrainerConfig, task: Task) -> dict[str, torch.Tensor]:
    """Random init from the seed, then the SFT warm-start: every worker starts from these."""
    tokenizer = build_tokenizer()
    policy = build_policy(cfg.model, tokenizer, seed=cfg.seed)
    losses = warm_start(policy, tokenizer, task, cfg.sft)
    if losses:
        log.info("SFT warm-start: %d steps, loss %.3f -> %.3f", len(losses), losses[0], losses[-1])
    return {k: v.detach().clone() for k, v in policy.state_dict().items()}


_TRAFFIC = frozenset({"logged", "sent_messages", "resent_messages", "unacked"})
"""Producer stats that count traffic, not loss."""
PROBLEM_KEYS = tuple(k for k in dict.fromkeys((*DROP_KEYS, *STAT_KEYS)) if k not in _TRAFFIC)
"""Producer counters that mean lost or rejected metrics: every drop of the protocol's
``DROP_KEYS`` and the other ``STAT_KEYS`` but traffic (``invalid``, ``nonfinite``,
``errors``); a counter the protocol adds is reported until it is known to be traffic."""


def producer_problems(stats: list[dict[str, int]]) -> dict[str, int]:
    """Summed producer counters that mean lost or rejected metrics (all zero when healthy).

    >>> producer_problems([{"logged": 9, "dropped_buffer_full": 2}, {"dropped_buffer_full": 1}])
    {'dropped_buffer_full': 3}
    """
    totals = {k: sum(s.get(k, 0) for s in stats) for k in PROBLEM_KEYS}
    return {k: v for k, v in totals.items() if v}


def start_per_node(cfg: TrainerConfig) -> Any:
    """A relay on every Ray node and the root, configured by the run's ``collector`` section."""
    from rlpulse.collector.config import CollectorConfig
    from rlpulse.collector.onray import RayCollectors, RayCollectorsConfig

    root = CollectorConfig.from_mapping(cfg.collector).placed_under(cfg.run_dir).to_mapping()
    tiers = RayCollectors.start(
        RayCollectorsConfig(root=root, state_root=str(cfg.run_dir / "collectors"))
    )
    log.info("root collector at %s, relays on %d nodes", tiers.root_address, len(tiers.relays))
    return tiers


def train(cfg: TrainerConfig) -> RunResult:
    """Run ``cfg``; start a collector when ``cfg.collector_address`` is None."""
    import ray  # heavy: imported when a run starts, not when the module is

    from rlpulse.trainer.cluster import close_workers, create_workers, init_ray

    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    log.info("configuration saved to %s", save_config(cfg))
    torch.set_num_threads(cfg.cluster.torch_threads)
    torch.manual_seed(cfg.seed)
    collector = tiers = None
    address = cfg.collector_address
    per_node = address is None and cfg.metrics and cfg.cluster.collectors == "per_node"
    if address is None and cfg.metrics and not per_node:
        from rlpulse.collector.config import CollectorConfig
        from rlpulse.collector.launch import start_collector

        ccfg = CollectorConfig.from_mapping(cfg.collector).placed_under(cfg.run_dir)
        # Unless the run's collector section names an address, any free loopback port.
        collector = start_collector(ccfg, bind=None if "bind" in cfg.collector else FREE_PORT)
        address = collector.address
        log.info("started a collector at %s", address)
    try:
        task = build_task(cfg.task, seed=cfg.seed)
        weights = initial_weights(cfg, task)
        started_ray = init_ray(cfg)
        if per_node:
            tiers = start_per_node(cfg)
        workers = create_workers(cfg, address, weights)
        # The driver registers last, once every worker's producer has registered.
        producer = cfg.producer(address, DRIVER)
        producer.run_config(_plain(to_dict(cfg)))  # the sinks' hyper-parameters
        result = RunResult()
        try:
            result = Driver(cfg, workers, producer, task).run()
        finally:
            stats = close_workers(workers)
            producer.flush(timeout=10.0)
            stats.append(producer.stats())
            producer.close()
            result.producer_problems = producer_problems(stats)
            if tiers is not None:
                tiers.stop()
            if started_ray:
                ray.shutdown()
    finally:
        if collector is not None:
            collector.stop()
    return result
