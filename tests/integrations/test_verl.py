"""verl's real ``Tracking`` with the ``rlpulse`` backend, against a real collector: in process,
through verl's ``run_ppo`` on Ray (the backend registered by Ray's setup hook in verl's
TaskRunner actor), and worker-side metrics against verl's own reduction across ranks."""

from __future__ import annotations

import json
import math
import os
import shlex
import time

import pytest
import yaml

pytest.importorskip(
    "verl", reason="verl is not installed: `make install-integrations` (.venv-integrations)"
)

import torch
from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla
from verl.utils.metric import AggregationType, Metric
from verl.utils.tracking import Tracking
from verl.workers.config import ActorConfig

from rlpulse.producer.integrations import verl as rlpulse_verl
from rlpulse.schemas import metrics as M
from rlpulse.schemas.errors import ConfigError
from rlpulse.schemas.reductions import Stat
from tests.integrations.helpers import ROOT, jsonl_collector, readme_block, records
from tests.integrations.verl_job import driver_metrics


@pytest.fixture
def registered():
    rlpulse_verl.register()
    yield
    rlpulse_verl.unregister()


def finite(metrics: dict) -> dict:
    return {k: float(v) for k, v in metrics.items() if math.isfinite(float(v))}


def test_register_extends_verls_class_and_unregister_restores_it() -> None:
    shipped = (Tracking.__init__, Tracking.finish, list(Tracking.supported_backend))
    with pytest.raises(AssertionError, match="rlpulse is not supported"):
        Tracking("p", "e", ["rlpulse"])
    rlpulse_verl.register()
    rlpulse_verl.register()  # idempotent
    try:
        assert Tracking.supported_backend.count("rlpulse") == 1
    finally:
        rlpulse_verl.unregister()
    assert (Tracking.__init__, Tracking.finish, Tracking.supported_backend) == shipped


def test_every_driver_metric_reaches_the_collector_with_run_name_and_config(
    tmp_path, registered
) -> None:
    config = {
        "trainer": {
            "project_name": "rlpulse-tests",
            "experiment_name": "verl-exp-1",
            "logger": ["console", "rlpulse"],
            "rlpulse": {"config_dir": str(tmp_path / "runs" / "{run}")},
        },
        "actor_rollout_ref": {"actor": {"optim": {"lr": 1e-6}}},
    }
    logged = {}
    with jsonl_collector(tmp_path) as (collector, out):
        config["trainer"]["rlpulse"]["address"] = collector.address
        tracking = Tracking("rlpulse-tests", "verl-exp-1", ["console", "rlpulse"], config=config)
        backend = tracking.logger["rlpulse"]
        for step in range(4):
            logged[step] = driver_metrics(step)
            tracking.log(data=logged[step], step=step)
        tracking.finish()
        tracking.finish()  # verl's __del__ calls it again
        assert backend.producer.stats()["unacked"] == 0
    got = records(out)
    assert sorted(got) == [0, 1, 2, 3]
    for step, metrics in logged.items():
        record = got[step]
        assert record["run"] == "verl-exp-1" and not record["partial"] and record["ranks"] == 1
        assert record["metrics"] == finite(metrics)  # every finite metric, bit for bit
    saved = yaml.safe_load((tmp_path / "runs" / "verl-exp-1" / "config.yaml").read_text())
    assert saved == config
    assert backend.config_path == (tmp_path / "runs" / "verl-exp-1" / "config.yaml").resolve()


def test_log_never_blocks_the_loop_without_a_collector(registered) -> None:
    config = {
        "trainer": {
            "rlpulse": {
                "address": "tcp://127.0.0.1:9",  # nothing listens there
                "config_dir": None,
                "producer": {"close_timeout_s": 0.5},
            }
        }
    }
    tracking = Tracking("p", "no-collector", ["rlpulse"], config=config)
    metrics = driver_metrics(0)
    durations = []
    for step in range(200):
        start = time.perf_counter()
        tracking.log(data=metrics, step=step)
        durations.append(time.perf_counter() - start)
    durations.sort()
    assert durations[100] < 0.005 and durations[-1] < 0.25, (durations[100], durations[-1])
    start = time.perf_counter()
    tracking.finish()
    assert time.perf_counter() - start < 3.0


@pytest.mark.parametrize(
    ("section", "field"),
    [
        ({"adress": "tcp://x:1"}, "rlpulse.trainer.rlpulse.adress"),
        ({"expected_roles": {"actor_train": 0}}, "rlpulse.trainer.rlpulse.expected_roles"),
        ({"worker_side": "critic/advantages"}, "rlpulse.trainer.rlpulse.worker_side"),
        ({"producer": {"close_timeout_s": -1}}, "rlpulse.trainer.rlpulse.producer.close_timeout_s"),
        ({"run": ""}, "rlpulse.trainer.rlpulse.run"),
    ],
)
def test_bad_settings_stop_verl_at_start_naming_the_field(section, field, registered) -> None:
    with pytest.raises(ConfigError) as err:
        Tracking("p", "e", ["console", "rlpulse"], config={"trainer": {"rlpulse": section}})
    assert err.value.field == field


def test_worker_side_metrics_are_exact_where_verls_reduction_is_not(
    tmp_path, registered, monkeypatch
) -> None:
    """Two data-parallel ranks with different token counts run verl's own policy loss; verl's
    driver reduces their pg_clipfrac as a mean of the ranks' means (``Metric.aggregate_dp``).
    Logged worker-side with the README's lines, the collector pools the tokens instead."""
    namespace: dict = {}
    exec(readme_block("#### Exact, from verl's workers"), namespace)
    log_micro_batch = namespace["log_micro_batch"]
    cfg = ActorConfig(
        strategy="fsdp",
        ppo_micro_batch_size_per_gpu=1,
        ppo_mini_batch_size=4,
        rollout_n=1,
        clip_ratio=0.2,
    )
    g = torch.Generator().manual_seed(0)
    shards = []
    for batch, length in ((2, 2), (5, 9)):  # rank 0: 2 sequences of 2 tokens; rank 1: 5 x 9
        old = torch.randn(batch, 9, generator=g)
        new = old + 0.6 * torch.randn(batch, 9, generator=g)
        adv = torch.randn(batch, 9, generator=g)
        mask = (torch.arange(9) < length).expand(batch, 9).float()
        shards.append((old, new, adv, mask))
    step, run = 3, "verl-exact"
    with jsonl_collector(tmp_path) as (collector, out):
        monkeypatch.setenv("RLPULSE_ADDRESS", collector.address)
        monkeypatch.setenv("RLPULSE_RUN", run)
        monkeypatch.setenv("WORLD_SIZE", "2")
        per_rank = []
        for rank, (old, new, adv, mask) in enumerate(shards):
            monkeypatch.setenv("RANK", str(rank))
            _, verl_metrics = compute_policy_loss_vanilla(old, new, adv, mask, "token-mean", cfg)
            ratio = torch.exp(torch.clamp(new - old, -20.0, 20.0))
            clipped = -adv * torch.clamp(ratio, 0.8, 1.2) > -adv * ratio  # verl's pg_clipfrac
            assert (clipped * mask).sum() / mask.sum() == pytest.approx(
                verl_metrics["actor/pg_clipfrac"], rel=1e-6
            )
            log_micro_batch(step, adv, mask, clipped)
            per_rank.append(Metric(AggregationType.MEAN, verl_metrics["actor/pg_clipfrac"]))
        verl_value = float(Metric.aggregate_dp(per_rank))  # what verl's driver logs
        tracking = Tracking(
            "p",
            run,
            ["rlpulse"],
            config={
                "trainer": {
                    "rlpulse": {
                        "address": collector.address,
                        "config_dir": None,
                        "expected_roles": {"actor_train": 2},
                        "worker_side": [M.CRITIC_ADVANTAGES.name, "actor/pg_clipfrac"],
                    }
                }
            },
        )
        tracking.log(
            {
                "actor/pg_clipfrac": verl_value,
                "critic/advantages/mean": -99.0,  # left out: the workers log it exactly
                "critic/score/mean": 0.5,
            },
            step=step,
        )
        tracking.finish()
        for rank in range(2):
            monkeypatch.setenv("RANK", str(rank))
            rlpulse_verl.worker_producer("actor_train").close()  # the same one: cached
    (record,) = records(out).values()
    assert record["ranks"] == 3 and not record["partial"]
    tokens = torch.cat([m.flatten() for *_, m in shards]).bool()
    clipped_all = torch.cat(
        [
            (
                -a * torch.clamp(torch.exp(torch.clamp(n - o, -20, 20)), 0.8, 1.2)
                > -a * torch.exp(torch.clamp(n - o, -20, 20))
            ).flatten()
            for o, n, a, _ in shards
        ]
    )
    exact = (clipped_all & tokens).sum().item() / tokens.sum().item()
    assert record["metrics"]["actor/pg_clipfrac"] == pytest.approx(exact, rel=1e-12)
    assert abs(verl_value - exact) > 0.01  # the mean of the ranks' means is not it
    advantages = torch.cat([a.flatten() for _, _, a, _ in shards])[tokens].double()
    adv = M.CRITIC_ADVANTAGES.output_names()
    assert record["metrics"][adv[Stat.MEAN]] == pytest.approx(advantages.mean().item(), rel=1e-9)
    assert record["metrics"][adv[Stat.MAX]] == pytest.approx(advantages.max().item())
    assert record["metrics"]["critic/score/mean"] == 0.5


def test_main_ppo_path_through_rays_setup_hook(tmp_path) -> None:
    """verl's config and ``run_ppo``: the README's overrides; Ray calls ``register()`` in the
    TaskRunner actor, where verl's Tracking gets the rlpulse backend."""
    import ray
    from hydra import compose, initialize_config_module
    from verl.trainer.main_ppo import run_ppo

    from tests.integrations.verl_job import ProbeTaskRunner

    probe = tmp_path / "probe.json"
    with jsonl_collector(tmp_path) as (collector, out):
        overrides = [
            *readme_overrides(),
            "trainer.project_name=rlpulse-tests",
            "trainer.experiment_name=verl-ray",
            f"+ray_kwargs.ray_init.runtime_env.env_vars.RLPULSE_ADDRESS={collector.address}",
            f"+ray_kwargs.ray_init.runtime_env.env_vars.PROBE_OUT={probe}",
            f"+trainer.rlpulse.config_dir='{tmp_path}/runs/{{run}}'",
            "ray_kwargs.ray_init.num_cpus=2",
        ]
        with initialize_config_module("verl.trainer.config", version_base=None):
            config = compose("ppo_trainer", overrides=overrides)
        try:
            run_ppo(config, task_runner_class=ProbeTaskRunner)
        finally:
            ray.shutdown()
    result = json.loads(probe.read_text())
    assert result["backends"] == ["console", "rlpulse"] and result["pid"] != os.getpid()
    got = records(out)
    assert sorted(got) == [0, 1, 2]
    for step in range(3):
        assert got[step]["run"] == "verl-ray"
        assert got[step]["metrics"] == finite(driver_metrics(step))
    saved = yaml.safe_load((tmp_path / "runs" / "verl-ray" / "config.yaml").read_text())
    assert saved["trainer"]["logger"] == ["console", "rlpulse"]


def readme_overrides() -> list[str]:
    """The overrides of the README's verl command (its ``key=value`` words)."""
    words = shlex.split(readme_block("### verl", lang="bash"))  # as the shell splits them
    return [w for w in words if "=" in w and "RLPULSE_ADDRESS=" not in w]


def test_example_settings_and_command_are_what_verl_and_rlpulse_accept(tmp_path) -> None:
    from hydra import compose, initialize_config_module

    example = yaml.safe_load((ROOT / "examples/verl/rlpulse.yaml").read_text())
    settings = rlpulse_verl.VerlSettings.from_config(example, "ignored")
    assert settings.run == "ignored" and settings.expected_roles == {"actor_train": 8}
    assert settings.producer.close_timeout_s == 5
    script = (ROOT / "examples/verl/run_ppo.sh").read_text()
    command = script[script.index("exec python") :].replace('"$@"', "")
    command = command.replace("$COLLECTOR", "tcp://127.0.0.1:5555").replace("$RUN", "gsm8k")
    overrides = [w for w in shlex.split(command) if "=" in w]
    with initialize_config_module("verl.trainer.config", version_base=None):
        config = compose("ppo_trainer", overrides=overrides)
    assert list(config.trainer.logger) == ["console", "rlpulse"]
    runtime_env = config.ray_kwargs.ray_init.runtime_env
    assert runtime_env.worker_process_setup_hook == "rlpulse.producer.integrations.verl.register"
    assert runtime_env.env_vars.RLPULSE_RUN == config.trainer.experiment_name == "gsm8k"


LATE_DRIVER_S = 4.0
"""Beyond the collector's ``settle_s`` (2 s by default), within its ``liveness_s`` (10 s)."""


def test_a_driver_registering_after_its_workers_loses_no_step(tmp_path) -> None:
    """Issue 21, item 5: verl's workers may log before ``fit()`` builds ``Tracking``. Once
    ``settle_s`` had passed the collector emitted the workers' steps without the driver and
    dropped the driver's as late. With the setup hook, the workers declare the driver
    (``RLPULSE_EXPECTED_ROLES=driver=1``) and the collector waits for it by name."""
    import ray
    from hydra import compose, initialize_config_module
    from verl.trainer.main_ppo import run_ppo

    from tests.integrations.verl_job import CLIPPED, LateDriverTaskRunner

    probe = tmp_path / "probe.json"
    with jsonl_collector(tmp_path) as (collector, out):
        overrides = [
            *readme_overrides(),
            "trainer.project_name=rlpulse-tests",
            "trainer.experiment_name=verl-late-driver",
            f"+ray_kwargs.ray_init.runtime_env.env_vars.RLPULSE_ADDRESS={collector.address}",
            "+ray_kwargs.ray_init.runtime_env.env_vars.RLPULSE_RUN=verl-late-driver",
            f"+ray_kwargs.ray_init.runtime_env.env_vars.PROBE_OUT={probe}",
            f"+ray_kwargs.ray_init.runtime_env.env_vars.LATE_DRIVER_S='{LATE_DRIVER_S}'",
            "+trainer.rlpulse.worker_side=['actor/pg_clipfrac']",
            "+trainer.rlpulse.expected_roles={actor_train: 2}",
            f"+trainer.rlpulse.config_dir='{tmp_path}/runs/{{run}}'",
            "ray_kwargs.ray_init.num_cpus=2",
            "+ray_kwargs.ray_init.include_dashboard=false",
            "+ray_kwargs.ray_init._node_ip_address=127.0.0.1",
        ]
        with initialize_config_module("verl.trainer.config", version_base=None):
            config = compose("ppo_trainer", overrides=overrides)
        try:
            run_ppo(config, task_runner_class=LateDriverTaskRunner)
        finally:
            ray.shutdown()
    got = records(out)
    assert sorted(got) == [0, 1, 2]
    clipped = sum(c for c, _ in CLIPPED.values()) / sum(n for _, n in CLIPPED.values())
    for step, record in got.items():
        assert not record["partial"] and record["ranks"] == 3, record["missing"]
        metrics = record["metrics"]
        assert metrics["actor/pg_clipfrac"] == pytest.approx(clipped, rel=1e-12)
        driver = finite(driver_metrics(step))
        del driver["actor/pg_clipfrac"]  # worker_side: the driver leaves its value out
        assert {k: metrics.get(k) for k in driver} == driver  # the driver's values, none late
    assert json.loads(probe.read_text())["declared"] == ["driver=1", "driver=1"]


def test_the_setup_hook_declares_the_driver_for_the_workers() -> None:
    """``register()`` sets ``RLPULSE_EXPECTED_ROLES=driver=1`` where it is unset (a user's own
    value is kept), and ``worker_producer`` declares those roles."""
    environ: dict[str, str] = {}
    try:
        rlpulse_verl.register(environ)
        assert environ == {"RLPULSE_EXPECTED_ROLES": "driver=1"}
        mine = {"RLPULSE_EXPECTED_ROLES": "ppo_driver=1,actor_train=8"}
        rlpulse_verl.register(mine)
        assert mine == {"RLPULSE_EXPECTED_ROLES": "ppo_driver=1,actor_train=8"}
    finally:
        rlpulse_verl.unregister()
    made = []
    worker_env = {**environ, "RLPULSE_RUN": "r", "RANK": "1", "WORLD_SIZE": "2"}
    rlpulse_verl.worker_producer(
        "critic", environ=worker_env, producer_factory=lambda *a, **k: made.append(k)
    )
    assert made[0]["expected_roles"] == {"driver": 1}
    with pytest.raises(ConfigError) as err:
        rlpulse_verl.worker_producer(
            "critic", environ={**worker_env, "RLPULSE_EXPECTED_ROLES": "driver"}
        )
    assert err.value.field == "RLPULSE_EXPECTED_ROLES"
