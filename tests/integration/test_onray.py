"""Collectors on Ray (``rlpulse.collector.onray``) in Ray's multi-node simulation on one machine: a
relay pinned to each of three nodes, a root on the driver's node, and ranks on every node
that find their node's relay without being given an address. The root's output is exact,
every step once, nothing partial, also when Ray restarts a relay killed mid-run."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from rlpulse.collector.onray import RayCollectors, RayCollectorsConfig  # noqa: E402
from tests.integration.workload import expected, run_rank  # noqa: E402

NODES, RANKS_PER_NODE, STEPS = 3, 2, 30
WORLD = NODES * RANKS_PER_NODE


def test_a_bad_config_is_refused_before_any_collector_starts() -> None:
    from rlpulse.schemas.errors import ConfigError

    bad = RayCollectorsConfig(root={"track_with": ["tensorbored"]})
    with pytest.raises(ConfigError, match="track_with"):
        bad.root_config("/tmp/x")
    with pytest.raises(ConfigError, match="grace_s"):
        RayCollectorsConfig(relay={"grace_s": -1}).relay_config("tcp://127.0.0.1:5", "/tmp/x")


def test_outside_a_ray_job_producers_keep_the_usual_default() -> None:
    from rlpulse.producer.env import default_address, node_relay_address
    from rlpulse.wire.rendezvous import DEFAULT_ADDRESS

    if ray.is_initialized():
        pytest.skip("this process is in a Ray job")
    assert node_relay_address() is None
    assert default_address({}) == DEFAULT_ADDRESS


@pytest.fixture(scope="module")
def cluster():
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    head = {"num_cpus": 1, "resources": {"node0": 100}, "include_dashboard": False}
    c = Cluster(initialize_head=True, head_node_args={**head, "node_ip_address": "127.0.0.1"})
    for n in range(1, NODES):
        c.add_node(num_cpus=1, resources={f"node{n}": 100}, node_ip_address="127.0.0.1")
    c.wait_for_nodes()
    ray.init(address=c.address, runtime_env={"env_vars": {"RAY_USAGE_STATS_ENABLED": "0"}})
    yield c
    ray.shutdown()
    c.shutdown()


@ray.remote(num_cpus=0)
class Rank:
    """One training rank: logs the shared workload with a producer given no address."""

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def run(self, run: str, rank: int, pause: float) -> str:
        os.environ.pop("RLPULSE_ADDRESS", None)
        return run_rank(None, run, "actor_train", rank, WORLD, STEPS, pause=pause)


def start_ranks(run: str, pause: float = 0.0) -> tuple[list, list]:
    ranks = [
        Rank.options(resources={f"node{rank // RANKS_PER_NODE}": 1}).remote()
        for rank in range(WORLD)
    ]
    return ranks, [r.run.remote(run, rank, pause) for rank, r in enumerate(ranks)]


def collectors(tmp_path: Path) -> tuple[RayCollectors, Path]:
    out = tmp_path / "root.jsonl"
    config = RayCollectorsConfig(
        root={
            "track_with": ["jsonl"],
            "tracker_kwargs": {"jsonl": {"path": str(out)}},
            "settle_s": 0,
            "grace_s": 120,
            "liveness_s": 60,
        },
        relay={"settle_s": 1, "grace_s": 120, "liveness_s": 60, "checkpoint_s": 0.5},
        state_root=str(tmp_path / "state"),
    )
    return RayCollectors.start(config), out


def check(out: Path, run: str) -> None:
    records = [json.loads(line) for line in out.read_text().splitlines()]
    mine = [r for r in records if r["run"] == run]
    assert [r["step"] for r in mine] == list(range(STEPS)), "every step once, in order"
    layout = [("actor_train", r) for r in range(WORLD)]
    for record in mine:
        assert not record["partial"] and record["ranks"] == WORLD, record["missing"]
        for name, value in expected(layout, record["step"]).items():
            assert record["metrics"][name] == pytest.approx(value, rel=1e-12, abs=1e-12), name


def test_a_relay_per_node_and_ranks_find_theirs(cluster, tmp_path: Path) -> None:
    tiers, out = collectors(tmp_path)
    try:
        nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        assert set(tiers.relay_addresses) == nodes and len(nodes) == NODES
        assert len(set(tiers.relay_addresses.values())) == NODES
        ranks, runs = start_ranks("onray")
        used = ray.get(runs, timeout=240)
        where = ray.get([r.node.remote() for r in ranks])
        for rank, (address, node) in enumerate(zip(used, where, strict=True)):
            assert address == tiers.relay_addresses[node], f"rank {rank} used {address}"
        homes = ray.get([a.__ray_call__.remote(_node) for a in tiers.relays.values()])  # pinned
        assert homes == list(tiers.relays)
    finally:
        tiers.stop()
    check(out, "onray")


def _node(actor: object) -> str:
    return ray.get_runtime_context().get_node_id()


def test_a_relay_killed_mid_run_is_restarted_by_ray_and_loses_nothing(
    cluster, tmp_path: Path
) -> None:
    tiers, out = collectors(tmp_path)
    try:
        _, runs = start_ranks("restart", pause=0.15)
        victim = next(n for n in tiers.relays if n != ray.get_runtime_context().get_node_id())
        before = tiers.relay_addresses[victim]
        deadline = time.monotonic() + 120
        while len(out.read_text().splitlines()) < STEPS // 4:  # mid-run, every rank logging
            assert time.monotonic() < deadline, "the root wrote no steps"
            time.sleep(0.05)
        ray.kill(tiers.relays[victim], no_restart=False)  # SIGKILL; Ray restarts it
        ray.get(runs, timeout=240)
        assert ray.get(tiers.relays[victim].address.remote(), timeout=120) == before
    finally:
        tiers.stop()
    check(out, "restart")
    log = Path(tiers.config.state_root, "rlpulse-ray").glob(f"*/relay-{victim[:16]}/collector.log")
    starts = next(log).read_text().count("listening on")
    assert starts == 2, "the relay was restarted once, on the same state_dir"


def test_stop_says_what_it_could_not_forward_or_write(cluster, tmp_path: Path) -> None:
    """A root that cannot take anything (SIGSTOPped): the relay holding a run's steps gives
    up after its ``sink_close_s`` and says how many records it did not forward; the root,
    still not exiting after ``timeout_s``, is killed; both are in ``stop()``'s report."""
    from rlpulse.producer import Producer

    config = RayCollectorsConfig(
        root={"track_with": ["jsonl"], "tracker_kwargs": {"jsonl": {"path": str(tmp_path / "o")}}},
        relay={"sink_close_s": 2},
        state_root=str(tmp_path / "state"),
    )
    tiers = RayCollectors.start(config)
    root_pid = ray.get(tiers.root.pid.remote())
    os.kill(root_pid, signal.SIGSTOP)
    try:
        producer = Producer(run="stuck", role="actor_train")  # no address: this node's relay
        for step in range(3):
            producer.log({"actor/pg_loss": 1.0}, step=step)
        producer.close()
        assert producer.stats()["unacked"] == 0, "the relay has every step"
        started = time.monotonic()
        report = tiers.stop(timeout_s=5)
        assert time.monotonic() - started < 60
    finally:
        with contextlib.suppress(ProcessLookupError):  # killed by stop(), as it should be
            os.kill(root_pid, signal.SIGCONT)
    here = ray.get_runtime_context().get_node_id()[:16]
    relay = f"relay on node {here}: "
    assert any(
        line.startswith(relay) and "not forwarded to the root" in line for line in report.left
    )
    assert report.root is not None and report.root.code is None
    assert any(line.startswith("root did not stop in time") for line in report.left)
    assert tiers.stop() is report  # safe to call twice
