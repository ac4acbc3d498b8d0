"""verl's worker calls as phases of their roles on their ranks, the step's trained generations
as samples, and the rollout-trainer mismatch as distributions: verl's driver methods and worker
classes on two Ray ranks whose setup hook is ``register`` (``verl_phase_job``), a real
collector writing the jsonl record and the trace."""

from __future__ import annotations

import shutil
import socket
import tempfile

import numpy as np
import pytest

pytest.importorskip(
    "verl", reason="verl is not installed: `make install-integrations` (.venv-integrations)"
)

from rlpulse.producer.integrations import verl as rlpulse_verl
from rlpulse.schemas import metrics as M, sketch
from tests.frameworks.helpers import jsonl_collector, records, spans

pytestmark = pytest.mark.timeout(900)
RUN = "verl-phases"
STEPS = 2
PHASES = {
    ("actor", "actor/compute_log_probs"),
    ("actor", "actor/train_step"),
    ("actor", "actor/model_update"),
    ("reference", "reference/compute_log_probs"),
    ("critic", "critic/compute_values"),
    ("critic", "critic/train_step"),
    ("rollout", "rollout/generate"),
}
"""(role, phase) of every worker call of a step, each on both ranks."""


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Two steps of the job against a collector; the records, spans and what the job saw."""
    import os

    import ray
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf
    from verl.utils.tracking import Tracking

    from tests.frameworks.verl_phase_job import OVERRIDES, run_steps, write_model

    tmp = tmp_path_factory.mktemp("verl-phases")
    model = write_model(tmp / "model")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rlpulse_verl.register()
    try:
        with jsonl_collector(tmp, trace=True) as (collector, out):
            overrides = [
                *OVERRIDES,
                "trainer.logger=[console,rlpulse]",
                "trainer.project_name=rlpulse-tests",
                f"trainer.experiment_name={RUN}",
                f"+trainer.rlpulse.address={collector.address}",
                "+trainer.rlpulse.config_dir=null",
                "+trainer.rlpulse.expected_roles={actor: 2, critic: 2, reference: 2, rollout: 2}",
                f"actor_rollout_ref.model.path={model}",
                "actor_rollout_ref.rollout.name=vllm",  # what verl's config requires
                "actor_rollout_ref.rollout.agent.num_workers=2",
                "actor_rollout_ref.rollout.prompt_length=8",
                "actor_rollout_ref.rollout.response_length=8",
            ]
            with initialize_config_module("verl.trainer.config", version_base=None):
                config = compose("ppo_trainer", overrides=overrides)
            ray_dir = tempfile.mkdtemp(prefix="rlpulse-ray-", dir="/tmp")  # short: Ray's sockets
            ray.init(
                num_cpus=2,
                include_dashboard=False,
                _node_ip_address="127.0.0.1",
                _temp_dir=ray_dir,
                runtime_env={
                    "worker_process_setup_hook": rlpulse_verl.SETUP_HOOK,
                    "env_vars": {
                        "RLPULSE_ADDRESS": collector.address,
                        "TOKENIZER_DIR": str(model),
                        "RAY_USAGE_STATS_ENABLED": "0",
                    },
                },
            )
            os.environ["TOKENIZER_DIR"] = str(model)
            try:
                tracking = Tracking(
                    "rlpulse-tests",
                    RUN,
                    ["console", "rlpulse"],
                    config=OmegaConf.to_container(config, resolve=True),
                )
                result = run_steps(config, STEPS, port, tracking, offload=True)
                tracking.finish()
            finally:
                ray.shutdown()
                shutil.rmtree(ray_dir, ignore_errors=True)
    finally:
        rlpulse_verl.unregister()
    return {"records": records(out), "spans": spans(tmp, RUN), **result}


def test_every_worker_call_is_a_phase_of_its_role_on_each_rank_at_its_step(job) -> None:
    got = {(s["role"], s["phase"], s["rank"], s["step"]) for s in job["spans"]}
    for step in range(1, STEPS + 1):
        for role, phase in PHASES:
            for rank in (0, 1):
                assert (role, phase, rank, step) in got, (role, phase, rank, step)
    assert job["roles"] == [["actor", "critic", "reference"]] * 2  # one producer per role
    assert job["rollout_roles"] == [["rollout"]] * 2  # the agent loop workers
    for step, record in job["records"].items():
        assert not record["partial"] and record["ranks"] == 9, record["missing"]
        metrics = record["metrics"]
        for _, phase in PHASES:
            cluster, name = phase.split("/")
            assert metrics[M.TIME_PHASE.format(cluster=cluster, phase=name, part="total")] > 0
            lag = M.STRAGGLER.format(cluster=cluster, phase=name, stat="slowest_rank")
            assert metrics[lag] in (0.0, 1.0), (step, phase)  # two ranks ran it


def test_the_engines_own_loads_are_the_phases_onload_and_offload(job) -> None:
    """The actor's engine offloads (verl's ``BaseEngineCtx`` moves it at each call): its
    phases have onload and offload, at least the engine's move time each; the critic's, whose
    engine does not offload, have neither."""
    from tests.frameworks.verl_phase_job import LOAD_S

    assert job["moves"][:2] == ["cuda", "cpu"]  # verl's device name, then back
    for record in job["records"].values():
        metrics = record["metrics"]
        for phase in ("compute_log_probs", "train_step"):
            for part in ("onload", "offload"):
                name = M.TIME_PHASE.format(cluster="actor", phase=phase, part=part)
                assert metrics[name] >= LOAD_S, name
        for part in ("onload", "offload"):
            name = M.TIME_PHASE.format(cluster="critic", phase="train_step", part=part)
            assert name not in metrics


def test_the_mismatch_is_every_response_tokens_distribution(job) -> None:
    """``rollout/logprob_diff`` over both ranks' tokens: mean, min and max exact, the
    quantiles within the sketch's bound of numpy's over the pooled tokens."""
    for step, batch in job["batches"].items():
        metrics = job["records"][int(step)]["metrics"]
        mask = np.asarray(batch["response_mask"], dtype=bool)
        rollout = np.asarray(batch["rollout_log_probs"], dtype=np.float32)
        old = np.asarray(batch["old_log_probs"], dtype=np.float32)
        diff = (rollout - old)[mask].astype(np.float64)
        name = M.ROLLOUT_LOGPROB_DIFF.name
        assert metrics[f"{name}/mean"] == pytest.approx(diff.mean(), abs=1e-9)
        assert (metrics[f"{name}/min"], metrics[f"{name}/max"]) == (diff.min(), diff.max())
        for q in sketch.QUANTILES:
            true = np.quantile(diff, q, method="inverted_cdf")
            got = metrics[f"{name}/p{round(q * 100)}"]
            assert abs(got - true) <= sketch.ALPHA * abs(true) + sketch.TINY, (q, got, true)
        ratio = np.exp(-diff)
        assert metrics[f"{M.ROLLOUT_PROB_RATIO.name}/mean"] == pytest.approx(ratio.mean(), rel=1e-6)


def test_the_steps_trained_generations_are_samples_with_their_staleness(job) -> None:
    from tests.frameworks.verl_phase_job import ROWS

    for step, batch in job["batches"].items():
        record = job["records"][int(step)]
        samples = record["samples"][M.ROLLOUT_SAMPLES.name]
        assert samples["key"] == "reward" and record["metrics"][M.ROLLOUT_SAMPLES.name] == ROWS
        mask = np.asarray(batch["response_mask"], dtype=bool)
        scores = np.asarray(batch["token_level_scores"]).sum(-1)
        advantages = np.asarray(batch["advantages"])
        behind = int(step) - 1 - np.asarray(batch["max_global_steps"])
        texts = {}  # (prompt, response) as verl's tokens decode: the row of the batch
        for i in range(ROWS):
            prompt_mask = batch["attention_mask"][i][: len(batch["prompts"][i])]
            prompt = [t for t, m in zip(batch["prompts"][i], prompt_mask, strict=True) if m]
            answer = [t for t, m in zip(batch["responses"][i], mask[i], strict=True) if m]
            texts[(" ".join(f"w{t}" for t in prompt), " ".join(f"w{t}" for t in answer))] = i
        assert samples["top"][0]["reward"] == pytest.approx(scores.max())
        for row in samples["top"] + samples["bottom"] + samples["random"]:
            i = texts[(row["prompt"], row["response"])]
            assert row["reward"] == pytest.approx(scores[i])
            assert row["advantage"] == pytest.approx(advantages[i][mask[i]].mean())
            assert row["response_length"] == mask[i].sum()
            assert row["staleness"] == behind[i]
            assert row["logprob_mismatch"] >= 0
        tokens = mask.sum(-1)
        stale = record["metrics"][f"{M.ASYNC_STALENESS.name}/mean"]
        assert stale == pytest.approx((behind * tokens).sum() / tokens.sum())


def test_the_worker_hooks_read_no_tensor_and_add_no_collective(tmp_path, monkeypatch) -> None:
    """verl's worker methods, wrapped by the setup hook's phases, driven by verl's driver
    methods with the driver's hook, in this process: every tensor read (``.item()``,
    ``.tolist()``...) and collective from rlpulse's code fails the test while a worker call
    runs (verl's own go through), and each call is still its phase, once (a worker method
    calling another is not a second phase)."""
    import asyncio
    import pickle
    from functools import partial

    import torch.distributed as dist
    from hydra import compose, initialize_config_module
    from transformers import AutoTokenizer
    from verl.workers.utils.losses import value_loss

    from rlpulse.producer import Producer, ProducerConfig
    from rlpulse.producer.integrations.verl_phases import WorkerPhases
    from rlpulse.producer.integrations.verl_trainer import TrainerHook
    from tests.frameworks.helpers import no_reads_from_rlpulse
    from tests.frameworks.verl_loss_job import critic_config
    from tests.frameworks.verl_phase_job import (
        OVERRIDES,
        Workers,
        ppo_step,
        stand_in_trainer,
        write_tokenizer,
    )
    from tests.support.net import free_port

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    opened: list[tuple[str, int]] = []
    producer = Producer(  # nothing listens: the phases are measured and dropped
        "tcp://127.0.0.1:9", run=RUN, role="actor", config=ProducerConfig(close_timeout_s=0.1)
    )

    class Recording:
        def phase(self, infix: str, *, step: int):
            opened.append((infix, step))
            return producer.phase(infix, step=step)

    hooks = (TrainerHook(), WorkerPhases(lambda role, run, address, **kw: Recording()))
    overrides = [*OVERRIDES, "trainer.logger=[rlpulse]", f"trainer.experiment_name={RUN}"]
    with initialize_config_module("verl.trainer.config", version_base=None):
        config = compose("ppo_trainer", overrides=overrides)

    def guarded(ranks, worker, method, shards):
        shards = [pickle.loads(pickle.dumps(s)) for s in shards]  # as Ray hands them over
        with no_reads_from_rlpulse():
            return [r.call(worker, method, s) for r, s in zip(ranks, shards, strict=True)]

    for hook in hooks:
        hook.install()
    try:
        workers = Workers(config, free_port(), actor_offload=True)
        workers.set_loss_fn(partial(value_loss, config=critic_config(config)))
        tokenizer = AutoTokenizer.from_pretrained(write_tokenizer(tmp_path / "tokenizer"))
        ppo_step(stand_in_trainer(config, [workers], tokenizer, guarded), 3)
        with no_reads_from_rlpulse():
            asyncio.run(workers.update_weights(3))
    finally:
        for hook in hooks:
            hook.uninstall()
        if dist.is_initialized():
            dist.destroy_process_group()
        producer.close()
    assert opened == [
        ("actor/compute_log_probs", 3),
        ("reference/compute_log_probs", 3),
        ("critic/compute_values", 3),
        ("critic/train_step", 3),
        ("actor/train_step", 3),
        ("actor/model_update", 3),
    ]
