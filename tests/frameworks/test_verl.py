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
from verl.utils.metric import AggregationType, Metric
from verl.utils.tracking import Tracking

from rlpulse.producer.integrations import verl as rlpulse_verl
from rlpulse.schemas import metrics as M
from rlpulse.schemas.errors import ConfigError
from rlpulse.schemas.reductions import Stat
from tests.frameworks.helpers import (
    ROOT,
    jsonl_collector,
    no_reads_from_rlpulse,
    readme_block,
    records,
)
from tests.frameworks.verl_job import driver_metrics


@pytest.fixture
def registered():
    rlpulse_verl.register()
    yield
    rlpulse_verl.unregister()


def finite(metrics: dict) -> dict:
    return {k: float(v) for k, v in metrics.items() if math.isfinite(float(v))}


def driver_values(metrics: dict) -> dict:
    """What the driver sends of ``metrics`` in a Ray job with the setup hook: the finite ones,
    but for the loss metrics the hooked workers log exactly (verl's default configuration)."""
    from rlpulse.producer.integrations.verl_states import exact_names

    return {k: v for k, v in finite(metrics).items() if k not in exact_names({})}


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
    """In process (no Ray job whose workers run the setup hook) the driver sends everything,
    verl's loss metrics included: nobody else logs them."""
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
    # the collector recorded it with the run: on its first step only
    assert got[0]["config"] == config and "config" not in got[1]
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
    """Metrics of your own, logged worker-side with the README's lines from two data-parallel
    ranks with different token counts: the collector pools the tokens, where verl's reduction
    across ranks (``Metric.aggregate_dp``, a mean of the ranks' means) does not."""
    namespace: dict = {}
    exec(readme_block("#### Exact, from verl's workers"), namespace)
    log_micro_batch = namespace["log_micro_batch"]
    g = torch.Generator().manual_seed(0)
    shards = []
    for batch, length in ((2, 2), (5, 9)):  # rank 0: 2 sequences of 2 tokens; rank 1: 5 x 9
        adv = torch.randn(batch, 9, generator=g)
        mask = (torch.arange(9) < length).expand(batch, 9).float()
        shards.append((adv, mask))
    step, run, name = 3, "verl-exact", "actor/positive_adv_frac"
    with jsonl_collector(tmp_path) as (collector, out):
        monkeypatch.setenv("RLPULSE_ADDRESS", collector.address)
        monkeypatch.setenv("RLPULSE_RUN", run)
        monkeypatch.setenv("WORLD_SIZE", "2")
        per_rank = []
        for rank, (adv, mask) in enumerate(shards):
            monkeypatch.setenv("RANK", str(rank))
            log_micro_batch(step, adv, mask)
            rank_mean = ((adv > 0) & mask.bool()).sum().item() / mask.sum().item()
            per_rank.append(Metric(AggregationType.MEAN, rank_mean))
        verl_value = float(Metric.aggregate_dp(per_rank))  # verl's reduction across ranks
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
                        "worker_side": [M.CRITIC_ADVANTAGES.name],
                    }
                }
            },
        )
        tracking.log(
            {
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
    tokens = torch.cat([m.flatten() for _, m in shards]).bool()
    advantages = torch.cat([a.flatten() for a, _ in shards])[tokens].double()
    exact = (advantages > 0).sum().item() / tokens.sum().item()
    assert record["metrics"][name] == pytest.approx(exact, rel=1e-12)
    assert abs(verl_value - exact) > 0.01  # the mean of the ranks' means is not it
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

    from tests.frameworks.verl_job import ProbeTaskRunner

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
            "+ray_kwargs.ray_init.address=local",
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
        assert got[step]["metrics"] == driver_values(driver_metrics(step))
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

    from tests.frameworks.verl_job import CLIPPED, LateDriverTaskRunner

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
            "+ray_kwargs.ray_init.address=local",
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
        driver = driver_values(driver_metrics(step))  # worker_side: the driver leaves them out
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


def test_verls_loss_metrics_are_exact_from_its_workers_with_the_setup_hook_alone(
    tmp_path,
) -> None:
    """The README's command and nothing else: verl's actor and critic updates on two ranks with
    ragged micro-batches; every rank's loss functions log their micro-batches, the collector
    pools them to the token truth, and the driver's own values of those names are left out."""
    from tests.frameworks.verl_loss_job import EXACT, run_job

    with jsonl_collector(tmp_path) as (collector, out):
        result = run_job(tmp_path, "verl-exact-loss", 2, readme_overrides(), collector.address)
    assert result["actor_hooked"] == [True, True] and result["critic_hooked"] == [True, True]
    assert result["producers"] == [2, 2]  # actor and critic, in each rank's process
    assert "global_steps" not in result["meta_left"]  # the batch is left as it was
    got = records(out)
    assert sorted(got) == [1, 2]
    for step, record in got.items():
        assert not record["partial"] and record["ranks"] == 5, record
        truth, verl_value = result["truth"][str(step)], result["verl"][str(step)]
        for name in EXACT:
            assert record["metrics"][name] == pytest.approx(truth[name], abs=1e-6), name
        # verl's mean over ranks and micro-batches of the micro-batches' means is not it
        for name in ("actor/pg_clipfrac", "actor/ppo_kl", "critic/vf_clipfrac"):
            assert abs(verl_value[name] - truth[name]) > 1e-3, (name, verl_value, truth)
        assert record["metrics"]["perf/mfu/actor"] == 0.0  # the driver's own metrics are there
        print(
            f"step {step}:",
            {
                n: (truth[n], record["metrics"][n] - truth[n], verl_value[n] - truth[n])
                for n in EXACT
            },
        )


class Recorder:
    def __init__(self):
        self.calls = []

    def log(self, data, step):
        self.calls.append((step, dict(data)))


def test_the_hook_logs_each_micro_batch_from_verls_own_tensors_and_reads_nothing_back() -> None:
    """verl's ``ppo_loss`` (bound as ``ActorRolloutRefWorker.init_model`` binds it) and
    ``value_loss`` on verl's micro-batches: each micro-batch's states equal verl's own values of
    that micro-batch, logged for the step in the batch; nothing is read back from a tensor."""
    from functools import partial

    from hydra import compose, initialize_config_module
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.metric import Metric
    from verl.workers.utils import losses

    from rlpulse.producer.integrations import verl_loss
    from rlpulse.producer.values import Fraction
    from tests.frameworks.verl_loss_job import (
        OVERRIDES,
        critic_config,
        local_micro_batches,
        make_batch,
        model_output,
        stub_rollout_server_modules,
    )

    with initialize_config_module("verl.trainer.config", version_base=None):
        config = compose("ppo_trainer", overrides=OVERRIDES)
    recorders = {"actor": Recorder(), "critic": Recorder()}
    hook = verl_loss.LossHook(lambda role, run, address: recorders[role])
    hook.install()
    try:
        stub_rollout_server_modules()
        from verl.workers import engine_workers

        assert engine_workers.ppo_loss is losses.ppo_loss  # bound to the wrapper
        actor = partial(
            engine_workers.ppo_loss, config=omega_conf_to_dataclass(config.actor_rollout_ref.actor)
        )
        critic = partial(losses.value_loss, config=critic_config(config))
        batch = make_batch(3)
        micro_batches = local_micro_batches(batch, step=7)
        verl_metrics = []
        with no_reads_from_rlpulse():
            for micro in micro_batches:
                out = {"log_probs": model_output(micro["new_log_probs"], micro)}
                _, actor_metrics = actor(model_output=out, data=micro, dp_group=None)
                out = {"values": model_output(micro["vpreds"], micro)}
                _, critic_metrics = critic(model_output=out, data=micro, dp_group=None)
                verl_metrics.append((actor_metrics, critic_metrics))
        with torch.no_grad():  # a forward-only pass (log probs): not logged
            out = {"log_probs": model_output(micro_batches[0]["new_log_probs"], micro_batches[0])}
            actor(model_output=out, data=micro_batches[0], dp_group=None)
    finally:
        hook.uninstall()
    assert losses.ppo_loss is vars(losses)["ppo_loss"] and not hasattr(
        losses.ppo_loss, "_rlpulse_loss_hook"
    )
    assert not hasattr(engine_workers.ppo_loss, "_rlpulse_loss_hook")  # put back too
    total = int(batch.batch["response_mask"].sum())
    assert len(recorders["actor"].calls) == len(recorders["critic"].calls) == len(micro_batches)
    for micro, (step, actor), (_, critic), (verl_actor, verl_critic) in zip(
        micro_batches,
        recorders["actor"].calls,
        recorders["critic"].calls,
        verl_metrics,
        strict=True,
    ):
        assert step == 7
        tokens = int(micro["response_mask"].sum())

        def value(state, tokens=tokens):
            if isinstance(state, Fraction):
                return float(state.numerator) / float(state.denominator)
            assert float(state.weight) == tokens
            return float(state.value)

        def verls(metric):
            return metric.values[0] if isinstance(metric, Metric) else metric

        for name in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"):
            assert value(actor[name]) == pytest.approx(verls(verl_actor[name]), abs=1e-6), name
        # verl's pg_loss is this micro-batch's token sum over the mini-batch's tokens
        local = verls(verl_actor["actor/pg_loss"]) * total / tokens
        assert value(actor["actor/pg_loss"]) == pytest.approx(local, rel=1e-5)
        assert value(critic["critic/vf_clipfrac"]) == pytest.approx(
            verls(verl_critic["critic/vf_clipfrac"]), abs=1e-6
        )
        assert value(critic["critic/vpred_mean"]) == pytest.approx(
            verls(verl_critic["critic/vpred_mean"]), abs=1e-6
        )
        local = verls(verl_critic["critic/vf_loss"]) * total / tokens
        assert value(critic["critic/vf_loss"]) == pytest.approx(local, rel=1e-5)


def test_an_untested_verl_version_stops_the_setup_hook_naming_it(monkeypatch) -> None:
    import verl
    from verl.workers.utils import losses

    environ: dict[str, str] = {}
    monkeypatch.setattr(verl, "__version__", "0.11.0")
    with pytest.raises(ConfigError, match=r"verl 0\.11\.0 is not a version") as err:
        rlpulse_verl.register(environ)
    assert err.value.value == "0.11.0" and rlpulse_verl._LOSS_HOOK is None
    try:  # RLPULSE_VERL_EXACT=0: the driver backend alone, verl's loss functions untouched
        rlpulse_verl.register({"RLPULSE_VERL_EXACT": "0"})
        assert rlpulse_verl._LOSS_HOOK is None
        assert not hasattr(losses.ppo_loss, "_rlpulse_loss_hook")
    finally:
        rlpulse_verl.unregister()
    monkeypatch.setattr(verl, "__version__", "0.9.1")
    monkeypatch.setattr(losses, "ppo_loss", lambda config, data: None)  # another signature
    with pytest.raises(ConfigError, match=r"verl 0\.9\.1's loss functions .*ppo_loss"):
        rlpulse_verl.register(environ)
    from rlpulse.producer.integrations.verl_compat import check_trainer

    class Trainer:
        def _update_actor(self, batch): ...

    with pytest.raises(ConfigError, match=r"verl 0\.9\.1's .*Trainer has no _update_critic"):
        check_trainer(Trainer)


@pytest.mark.parametrize(
    ("overrides", "actor", "critic"),
    [
        ([], "pg_loss pg_clipfrac pg_clipfrac_lower ppo_kl", "vf_loss vf_clipfrac vpred_mean"),
        (
            ["actor_rollout_ref.actor.loss_agg_mode=token-sum", "critic.loss_agg_mode=token-sum"],
            "pg_clipfrac pg_clipfrac_lower ppo_kl",  # a sum, not a mean: verl's value stays
            "vf_clipfrac vpred_mean",
        ),
        (
            ["actor_rollout_ref.actor.policy_loss.loss_mode=gspo"],
            "",
            "vf_loss vf_clipfrac vpred_mean",
        ),
        (
            ["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"],
            "",
            "vf_loss vf_clipfrac vpred_mean",
        ),
        (["actor_rollout_ref.actor.strategy=megatron", "critic.strategy=megatron"], "", ""),
    ],
)
def test_the_driver_leaves_out_what_the_workers_log_exactly(overrides, actor, critic) -> None:
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from rlpulse.producer.integrations.verl_states import exact_names

    with initialize_config_module("verl.trainer.config", version_base=None):
        config = compose("ppo_trainer", overrides=overrides)
    names = exact_names(OmegaConf.to_container(config, resolve=True))
    expected = [f"actor/{n}" for n in actor.split()] + [f"critic/{n}" for n in critic.split()]
    assert sorted(names) == sorted(expected)
