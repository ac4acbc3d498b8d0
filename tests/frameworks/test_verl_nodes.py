"""docs/integrations.md's "verl on more than one node", as far as one machine allows (issue 45,
item 10): two network namespaces joined by a veth pair stand for two nodes
(:mod:`tests.support.nodes`), each with a loopback of its own, so the workers' node reaches the
collector only through its reachable bind.

The collector's node: the page's keygen commands and collector config as written (its
address, ``10.0.0.5``, replaced by the node's). The other node: the two key files the page
says to copy, copied into a folder of their own, and verl's ``run_ppo`` on a Ray instance of
its own, its config composed by verl's Hydra from the page's command (the address and the key
folder replaced by the test's). Ray's ``runtime_env`` is then all that configures rlpulse
there: verl's ``TaskRunner`` builds ``Tracking`` with the ``rlpulse`` backend (the driver) and
two actors of the job log through ``worker_producer`` (``LateDriverTaskRunner``, the driver
registering right after them). Covered: the bind, Curve, the environment variables reaching
the driver and the workers through Ray, every step complete over the veth, and a plaintext
producer from that node refused and counted. Not covered: a second machine, a Ray cluster of
more than one node, verl's GPU workers.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

pytest.importorskip(
    "verl", reason="verl is not installed: `make install-integrations` (.venv-integrations)"
)

from tests.docs import doc_block, doc_section
from tests.frameworks.helpers import INTEGRATIONS_DOC, ROOT, records
from tests.frameworks.verl_job import CLIPPED, driver_metrics
from tests.support import nodes

pytestmark = pytest.mark.timeout(420)
SECTION = "#### verl on more than one node"
PAGE_HOST = "10.0.0.5"
PAGE_KEYS = "/etc/rlpulse/keys"
RUN = "verl-nodes"

NODE_JOB = """
import sys

import ray
from hydra import compose, initialize_config_module
from verl.trainer.main_ppo import run_ppo

from tests.frameworks.verl_job import LateDriverTaskRunner

with initialize_config_module("verl.trainer.config", version_base=None):
    config = compose("ppo_trainer", overrides=sys.argv[1:])
try:
    run_ppo(config, task_runner_class=LateDriverTaskRunner)
finally:
    ray.shutdown()
"""
"""verl's entry point, ``main_ppo``'s ``run_ppo``, with the test's task runner."""

PLAINTEXT = """
import sys
from rlpulse.producer import Producer, ProducerConfig

p = Producer(sys.argv[1], run="plain", role="probe", rank=0, world_size=1,
             config=ProducerConfig(close_timeout_s=2.0))
p.log({"probe/x": 1.0}, step=0)
p.close()
print(p.stats()["unacked"])
"""


def commands(block: str) -> list[str]:
    return [c for line in block.splitlines() if (c := line.split("#")[0].strip())]


def test_verl_on_two_nodes_over_curve_as_the_page_writes_it(tmp_path: Path) -> None:
    why = nodes.why_not()
    if why is not None:
        pytest.skip(f"two network namespaces: {why}")
    keygen, job = (doc_block(INTEGRATIONS_DOC, SECTION, "bash", i) for i in (0, 1))
    config = yaml.safe_load(doc_block(INTEGRATIONS_DOC, SECTION, "yaml"))
    assert f"`{PAGE_KEYS}/`" in doc_section(INTEGRATIONS_DOC, SECTION)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    rlpulse = str(Path(sys.executable).parent / "rlpulse")

    host = tmp_path / "collector-host"  # the collector's node: keys and config, as written
    host.mkdir()
    for command in commands(keygen):
        command = re.sub(r"^rlpulse ", f"{rlpulse} ", command)
        subprocess.run(command, shell=True, cwd=host, env=env, check=True, capture_output=True)
    node_keys = tmp_path / "node-keys"  # the folder the page copies the two files to
    node_keys.mkdir()
    for name in ("server/collector.key", "worker/worker.key_secret"):
        shutil.copy(host / "keys" / name, node_keys)

    with nodes.two_nodes() as (collector_node, worker_node):
        config["bind"] = config["bind"].replace(PAGE_HOST, collector_node.address)
        (host / "collector.yaml").write_text(yaml.safe_dump(config))
        log = (tmp_path / "collector.log").open("w")
        collector = collector_node.popen(
            [rlpulse, "collector", "--config", "collector.yaml", "--ready-file", "ready"],
            cwd=host,
            env=env,
            stderr=log,
            stdout=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 60
            while not (host / "ready").exists():
                assert collector.poll() is None, (tmp_path / "collector.log").read_text()
                assert time.monotonic() < deadline
                time.sleep(0.05)
            address = f"tcp://{collector_node.address}:5555"
            assert config["bind"] == address

            words = shlex.split(job.replace("\\\n", " "))  # as the shell splits them
            overrides = [
                w.replace(PAGE_HOST, collector_node.address).replace(PAGE_KEYS, str(node_keys))
                for w in words
                if "=" in w
            ]
            assert sum("RLPULSE_CURVE_" in w for w in overrides) == 2
            probe = tmp_path / "probe.json"
            ray_dir = tempfile.mkdtemp(prefix="r45-", dir="/tmp")  # short: Ray's socket paths
            overrides += [
                "trainer.project_name=rlpulse-tests",
                f"trainer.experiment_name={RUN}",
                f"+ray_kwargs.ray_init.runtime_env.env_vars.RLPULSE_RUN={RUN}",
                f"+ray_kwargs.ray_init.runtime_env.env_vars.PROBE_OUT={probe}",
                "+ray_kwargs.ray_init.runtime_env.env_vars.LATE_DRIVER_S='0'",
                "+trainer.rlpulse.worker_side=['actor/pg_clipfrac']",
                "+trainer.rlpulse.expected_roles={actor_train: 2}",
                f"+trainer.rlpulse.config_dir='{tmp_path}/runs/{{run}}'",
                "ray_kwargs.ray_init.num_cpus=2",
                "+ray_kwargs.ray_init.include_dashboard=false",
                "+ray_kwargs.ray_init._node_ip_address=127.0.0.1",
                "+ray_kwargs.ray_init.address=local",
                f"+ray_kwargs.ray_init._temp_dir={ray_dir}",
            ]
            # The worker node's own environment has no rlpulse setting: only the job's.
            node_env = {k: v for k, v in env.items() if not k.startswith("RLPULSE_")}
            try:
                done = worker_node.run(
                    [sys.executable, "-c", NODE_JOB, *overrides],
                    cwd=tmp_path,
                    env=node_env,
                    capture_output=True,
                    text=True,
                    timeout=300,
                )
            finally:
                shutil.rmtree(ray_dir, ignore_errors=True)
            assert done.returncode == 0, done.stderr[-4000:]
            plain = worker_node.run(
                [sys.executable, "-c", PLAINTEXT, address],
                env=node_env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert plain.returncode == 0, plain.stderr[-2000:]
            assert int(plain.stdout.split()[-1]) > 0  # never acknowledged
        finally:
            collector.terminate()
            code = collector.wait(60)
            log.close()
    text = (tmp_path / "collector.log").read_text()
    assert code == 0, text
    assert f"listening on {address}" in text and "CurveZMQ on" in text, text
    failures = int(re.search(r"(\d+) handshake failures", text).group(1))  # type: ignore[union-attr]
    assert failures >= 1, text  # the plaintext producer (it may retry the handshake)
    got = records(host / "runs" / "gsm8k-ppo" / "metrics.jsonl")
    assert sorted(got) == [0, 1, 2]
    clipped = sum(c for c, _ in CLIPPED.values()) / sum(n for _, n in CLIPPED.values())
    for step, record in got.items():
        assert record["run"] == RUN and not record["partial"] and record["ranks"] == 3, record
        assert record["metrics"]["actor/pg_clipfrac"] == pytest.approx(clipped, rel=1e-12)
        assert record["metrics"]["critic/score/mean"] == pytest.approx(
            float(driver_metrics(step)["critic/score/mean"])
        )
    assert json.loads((tmp_path / "probe.json").read_text())["declared"] == ["driver=1"] * 2
