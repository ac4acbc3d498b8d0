"""verl's rollout servers through the engine path: the setup hook (``register``) finds the
servers verl's ``LLMServerManager`` starts and windows every ``AgentLoopManager.generate_sequences``
call of the driver at its batch's step; the driver's producer (the ``rlpulse`` tracking
backend's) logs the step's ``rollout/engine/...``, equal to what the step's generations
(training and validation) received from a real vLLM server (the CPU build, from ``.venv``).

What is verl's and what stands in, and why: verl 0.9 starts its vLLM servers inside Ray actors
with CUDA (and vLLM is not installed in ``.venv-integrations``: verl pins an older transformers
than vLLM's CPU build), so the one server here (the session's, ``tests/frameworks/conftest.py``)
is started from ``.venv`` and verl's
``LLMServerManager._initialize_llm_servers`` (verl's code, with verl's composed config) builds
its replicas from a replica class that adopts that server (``rollout_replica_class``, verl's
hook for recipes) instead of launching one; ``AgentLoopManager.generate_sequences`` (verl's
code: chunking, gathering, its performance metrics) hands its chunks to a stand-in agent loop
worker that sends them to the server over HTTP (verl's workers reach their server through a
Ray actor handle; the engine counts the requests the same way). ``Tracking`` and the
``rlpulse`` backend are verl's and rlpulse's own.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import shutil
import sys
import tempfile
import threading
import types
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl", reason="verl is not installed (make install-integrations)")

import numpy as np
import ray
import torch
from omegaconf import DictConfig

from rlpulse.producer.env import ENGINES_TIMEOUT_VAR
from rlpulse.producer.integrations import verl as rlpulse_verl, verl_engines
from rlpulse.schemas import engine as E
from tests.frameworks.helpers import jsonl_collector, records
from tests.frameworks.verl_loss_job import stub_rollout_server_modules
from tests.support.vllm import (
    Answered,
    Server,
    complete,
)

pytestmark = pytest.mark.timeout(900)
RUN = "verl-engines"


@pytest.fixture
def server(vllm_server: Server) -> Server:
    """The session's real vLLM server (tests/frameworks/conftest.py)."""
    return vllm_server


@pytest.fixture
def hooked(monkeypatch: pytest.MonkeyPatch) -> Any:
    """verl's classes as the setup hook leaves them in the driver's process (scrapes may take
    seconds on a loaded test machine: the watch waits up to a minute)."""
    monkeypatch.setenv(ENGINES_TIMEOUT_VAR, "60")
    stub_rollout_server_modules()  # verl's agent loop imports its servers' modules
    rlpulse_verl.register(environ={})
    try:
        yield
    finally:
        rlpulse_verl.unregister()


def verl_config(address: str, disable_log_stats: bool = False) -> DictConfig:
    """verl's composed PPO config: one standalone rollout replica, the rlpulse backend."""
    from hydra import compose, initialize_config_module

    with initialize_config_module("verl.trainer.config", version_base=None):
        return compose(
            "ppo_trainer",
            overrides=[
                f"actor_rollout_ref.rollout.disable_log_stats={disable_log_stats}",
                "actor_rollout_ref.rollout.nnodes=1",
                "actor_rollout_ref.rollout.n_gpus_per_node=1",
                "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
                "trainer.logger=[rlpulse]",
                "trainer.project_name=rlpulse-tests",
                f"trainer.experiment_name={RUN}",
                f"+trainer.rlpulse.address={address}",
                "+trainer.rlpulse.config_dir=null",
            ],
        )


def adopting(server: Server) -> type:
    """A rollout replica class that adopts ``server`` where verl's would launch one."""

    class Adopting:
        def __init__(self, replica_rank: int, config: Any, model_config: Any, **kw: Any) -> None:
            self.replica_rank = replica_rank
            self._server_handle: Any = None
            self._server_address = ""

        async def init_standalone(self) -> None:
            self._server_address = server.base.removeprefix("http://")

    return Adopting


class Worker:
    """Stands in for verl's agent loop worker actor (``worker.generate_sequences.remote``):
    sends its chunk's prompts to the server over HTTP and answers in verl's output layout."""

    def __init__(self, server: Server, answered: dict[int, Answered]) -> None:
        self.server, self.answered = server, answered
        self.generate_sequences = self
        self.remote = self._generate

    async def _generate(self, chunk: Any) -> Any:
        from verl import DataProto

        prompts = [list(p) for p in chunk.non_tensor_batch["prompt_ids"]]
        response = await asyncio.to_thread(complete, self.server, prompts, 8)
        self.answered.setdefault(chunk.meta_info["global_steps"], Answered()).add(response)
        rows = len(prompts)
        metrics = {"generate_sequences": 0.1, "tool_calls": 0.0, "compute_score": 0.0}
        return DataProto.from_single_dict(
            {
                "prompts": torch.zeros(rows, 4, dtype=torch.long),
                "attention_mask": torch.ones(rows, 12, dtype=torch.long),
            },
            meta_info={"metrics": [{**metrics, "num_preempted": 0}] * rows},
        )


def generation_batch(step: int, rows: int, validate: bool = False) -> Any:
    from verl import DataProto

    prompts = np.empty(rows, dtype=object)
    prompts[:] = [[5 + (i % 30), 6, 7] for i in range(rows)]
    meta = {"global_steps": step, **({"validate": True} if validate else {})}
    return DataProto.from_single_dict({"prompt_ids": prompts}, meta_info=meta)


def test_the_driver_logs_its_servers_metrics_per_step(
    hooked: Any, server: Server, tmp_path: Path
) -> None:
    from verl.experimental.agent_loop.agent_loop import AgentLoopManager
    from verl.utils.tracking import Tracking
    from verl.workers.rollout.llm_server import LLMServerManager

    answered: dict[int, Answered] = {}
    with jsonl_collector(tmp_path) as (collector, out):
        config = verl_config(collector.address)

        class Manager(LLMServerManager):
            rollout_replica_class = adopting(server)

        manager = Manager(config=config)
        asyncio.run(manager._initialize_llm_servers())  # verl's own, hooked
        assert [server.metrics_url] == verl_engines._SERVERS
        tracking = Tracking(RUN, RUN, ["rlpulse"], config=config)  # as fit() builds it
        rollout = AgentLoopManager(config, llm_client=None)
        rollout.agent_loop_workers = [Worker(server, answered), Worker(server, answered)]
        for step in (1, 2, 3):
            rollout.generate_sequences(generation_batch(step, rows=4 + 2 * step))
            if step == 2:  # validation generates inside step 2 too
                rollout.generate_sequences(generation_batch(step, rows=6, validate=True))
            tracking.log(data={"actor/lr": 1e-6}, step=step)
        tracking.finish()
    got = records(out)
    assert sorted(got) == [1, 2, 3]
    for step, record in got.items():
        metrics, truth = record["metrics"], answered[step]
        assert metrics[E.ENGINE_SERVERS_UNREAD.name] == 0 and metrics[E.ENGINE_SERVERS.name] == 1
        assert metrics[E.ENGINE_REQUESTS.name] == truth.requests == 4 + 2 * step + 6 * (step == 2)
        assert metrics[E.ENGINE_GENERATION_TOKENS.name] == truth.completion_tokens
        assert metrics[E.ENGINE_PROMPT_TOKENS.name] == truth.prompt_tokens
        for reason in ("stop", "length"):
            assert metrics[E.ENGINE_FINISHED.format(reason=reason)] == truth.reasons[reason]
        for histogram in (E.ENGINE_TTFT, E.ENGINE_E2E_LATENCY, E.ENGINE_QUEUE_TIME):
            assert sum(metrics.get(b, 0) for b in histogram.bucket_names) == truth.requests
        assert metrics["actor/lr"] == 1e-6  # the driver's own values, beside


def test_an_awaiting_caller_gets_the_coroutine_and_its_window(hooked: Any, server: Server) -> None:
    """verl's asynchronous trainers ``await`` generate_sequences from their event loop
    (verl's ``auto_await`` hands them the coroutine): still so, and the window closes when
    the awaited call ends."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopManager

    logged: list[tuple[int, dict]] = []

    class Logs:
        def log(self, data: Any, step: int) -> None:
            logged.append((step, dict(data)))

    verl_engines.watch(Logs()).add([server.metrics_url])
    answered: dict[int, Answered] = {}
    rollout = AgentLoopManager(verl_config("tcp://127.0.0.1:9"), llm_client=None)
    rollout.agent_loop_workers = [Worker(server, answered), Worker(server, answered)]

    async def trainer_loop() -> Any:
        return await rollout.generate_sequences(generation_batch(7, rows=4))

    output = asyncio.run(trainer_loop())
    assert len(output) == 4
    ((step, metrics),) = logged
    assert step == 7 and metrics[E.ENGINE_REQUESTS.name] == answered[7].requests == 4


def stub_transfer_queue() -> None:
    """verl's v1 agent loop imports TransferQueue, absent here (its workers put trajectories
    there; the dispatch this test runs never touches it): an empty stand-in, only where the
    real module is missing."""
    if "transfer_queue" not in sys.modules and importlib.util.find_spec("transfer_queue") is None:
        module = types.ModuleType("transfer_queue")

        def missing(name: str) -> Any:  # any name verl imports from it: an inert class
            if name.startswith("__"):
                raise AttributeError(name)
            return type(name, (), {"__init__": lambda self, *a, **k: None})

        module.__getattr__ = missing  # type: ignore[method-assign]
        sys.modules["transfer_queue"] = module


@ray.remote
class Dispatched:
    """Stands in for verl v1's agent loop worker actor: ``generate_sequences`` starts the
    chunk's requests to the server and returns at once (verl's put their trajectories into
    TransferQueue); ``collect`` waits for them, as verl's replay buffer does."""

    def __init__(self, base: str, model: str) -> None:
        self.server = Server(base, None, model, Path(os.devnull))  # type: ignore[arg-type]
        self.sent: list[threading.Thread] = []
        self.answered = Answered()

    def generate_sequences(self, chunk: Any) -> None:
        from verl.utils import tensordict_utils as tu

        prompts = tu.get(chunk, "prompt_ids")
        thread = threading.Thread(
            target=lambda: self.answered.add(complete(self.server, prompts, 8))
        )
        thread.start()
        self.sent.append(thread)

    def collect(self) -> Answered:
        for thread in self.sent:
            thread.join()
        self.sent, answered, self.answered = [], self.answered, Answered()
        return answered


def test_verl_v1_dispatches_open_windows_that_the_steps_log_closes(
    hooked: Any, server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """verl 0.9's default trainer (v1, ``trainer.use_v1``): ``AgentLoopManagerTQ`` dispatches
    a step's prompts without waiting and the trainer waits on its replay buffer, so each
    dispatch begins a window at its batch's step (ending the one before) and the step's log
    ends it; validation dispatched inside the step is a window of that step too."""
    import torch
    from verl.utils import tensordict_utils as tu
    from verl.utils.tracking import Tracking

    stub_transfer_queue()
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ

    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    ray_dir = tempfile.mkdtemp(prefix="rlpulse-ray-")  # Ray's socket paths must stay short
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        _temp_dir=ray_dir,
        address="local",
    )
    answered: dict[int, Answered] = {}
    try:
        workers = [Dispatched.remote(server.base, server.model) for _ in range(2)]
        with jsonl_collector(tmp_path) as (collector, out):
            config = verl_config(collector.address)
            verl_engines.servers_started([server.base.removeprefix("http://")])
            tracking = Tracking(RUN, RUN, ["rlpulse"], config=config)
            rollout = AgentLoopManagerTQ(config, llm_client=None)
            rollout.agent_loop_workers = workers

            def dispatch(step: int, rows: int) -> None:
                prompts = [[5 + i, 6, 7] for i in range(rows)]
                batch = tu.get_tensordict(
                    {"input_ids": torch.zeros(rows, 3, dtype=torch.long), "prompt_ids": prompts}
                )
                tu.assign_non_tensor_data(batch, "global_steps", step)
                rollout.generate_sequences(batch)  # returns before the generation ends
                for got in ray.get([w.collect.remote() for w in workers]):  # the replay buffer
                    answered.setdefault(step, Answered())
                    answered[step] += got

            for step in (1, 2, 3):
                dispatch(step, rows=4 + 2 * step)
                if step == 2:
                    dispatch(step, rows=6)  # validation, inside step 2
                tracking.log(data={"actor/lr": 1e-6}, step=step)
            tracking.finish()
    finally:
        ray.shutdown()
        shutil.rmtree(ray_dir, ignore_errors=True)
    got = records(out)
    assert sorted(got) == [1, 2, 3]
    for step, record in got.items():
        metrics, truth = record["metrics"], answered[step]
        assert metrics[E.ENGINE_SERVERS_UNREAD.name] == 0 and metrics[E.ENGINE_SERVERS.name] == 1
        assert metrics[E.ENGINE_REQUESTS.name] == truth.requests == 4 + 2 * step + 6 * (step == 2)
        assert metrics[E.ENGINE_GENERATION_TOKENS.name] == truth.completion_tokens
        for histogram in (E.ENGINE_TTFT, E.ENGINE_E2E_LATENCY):
            assert sum(metrics.get(b, 0) for b in histogram.bucket_names) == truth.requests


def test_servers_without_statistics_are_not_watched(
    hooked: Any, server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    """verl's default runs its servers with disable_log_stats: nothing to count, so they are
    left out, with a warning naming the setting."""
    from verl.workers.rollout.llm_server import LLMServerManager

    class Manager(LLMServerManager):
        rollout_replica_class = adopting(server)

    manager = Manager(config=verl_config("tcp://127.0.0.1:9", disable_log_stats=True))
    with caplog.at_level(logging.WARNING, logger="rlpulse.integrations.verl"):
        asyncio.run(manager._initialize_llm_servers())
    assert manager.server_addresses and verl_engines._SERVERS == []
    assert "actor_rollout_ref.rollout.disable_log_stats=False" in caplog.text


def test_unregister_restores_verls_methods(hooked: Any) -> None:
    from verl.experimental.agent_loop.agent_loop import AgentLoopManager
    from verl.workers.rollout.llm_server import LLMServerManager

    wrapped = AgentLoopManager.generate_sequences, LLMServerManager._initialize_llm_servers
    rlpulse_verl.unregister()
    restored = AgentLoopManager.generate_sequences, LLMServerManager._initialize_llm_servers
    assert all(a is not b for a, b in zip(wrapped, restored, strict=True))
    assert "_rlpulse_engines_original" not in vars(AgentLoopManager)
    rlpulse_verl.register(environ={})  # the fixture unregisters again
