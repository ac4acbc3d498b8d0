"""The YAML block through real ROLL on Ray (``test_roll_real.py``): ROLL's own ``init()`` (its
``ray.init``, with ``RAY_RUNTIME_ENV_HOOK`` set as ``system_envs`` sets it), ROLL's
``create_tracker`` and a ROLL ``Cluster`` of two CPU workers of the class below."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from roll.distributed.executor.worker import Worker
from roll.distributed.scheduler.decorator import Dispatch, register


class ProbeWorker(Worker):
    """A ROLL worker whose calls are phases once the pipeline config says ``rlpulse``."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def initialize(self, pipeline_config: Any) -> None:
        self.pipeline_config = pipeline_config

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def add(self, x: int) -> int:
        return self.rank + x

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def probe(self) -> dict[str, Any]:
        from rlpulse.producer.integrations import roll as rlpulse_roll, roll_worker

        return {
            "setup": rlpulse_roll.WORKER_HOOK is not None,
            "phases": roll_worker.CLOCK.counts["phases"],
            "producers": [list(k) for k in roll_worker._PRODUCERS],
        }


def run(tmp_path: Path) -> dict[str, Any]:
    from roll.configs.worker_config import WorkerConfig
    from roll.distributed.executor.cluster import Cluster
    from roll.distributed.scheduler.initialize import init
    from roll.distributed.scheduler.resource_manager import ResourceManager
    from roll.utils.tracking import create_tracker

    init()  # ROLL's ray.init: Ray runs RAY_RUNTIME_ENV_HOOK in this process
    config = SimpleNamespace(
        exp_name="roll-yaml",
        track_with="rlpulse",
        resume_from_checkpoint=False,
        tracker_kwargs={
            "address": "tcp://127.0.0.1:9",
            "config_dir": str(tmp_path / "{run}"),
            "producer": {"close_timeout_s": 0.5},
        },
    )
    tracker = create_tracker("rlpulse", config=dict(vars(config)), **config.tracker_kwargs)
    cluster: Any = Cluster(
        name="test_cluster",
        resource_manager=ResourceManager(0, 1),
        worker_cls=ProbeWorker,
        worker_config=WorkerConfig(name="test_cluster", world_size=2),
    )
    cluster.initialize(pipeline_config=config)
    assert cluster.add(x=1) == [1, 2]
    probes = cluster.probe()
    tracker.log({"actor/lr@last": 1.0}, step=0)
    tracker.finish()
    return {
        "tracker": type(tracker).__name__,
        "setup_ran": [p["setup"] for p in probes],
        "phases": [[p["producers"][0][2], "test_cluster/add"] for p in probes if p["phases"] >= 1],
    }
