"""vLLM rollout engine: generation on a GPU, with weight sync from the trainer (model_update).

Used when ``rollout.backend`` is ``vllm``, or ``auto`` with vLLM importable and a CUDA device.
vLLM loads a HuggingFace directory, so the engine starts from the initial policy written with
``save_pretrained``; each step's new weights are pushed into the running engine with the model's
``load_weights`` (no restart, no disk).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Sequence
from typing import Any

import torch


def vllm_available() -> bool:
    """vLLM is installed and there is a GPU for it."""
    return importlib.util.find_spec("vllm") is not None and torch.cuda.is_available()


class VLLMEngine:
    """A ``vllm.LLM`` with sampling and in-place weight updates."""

    def __init__(
        self, model_dir: str, max_new_tokens: int, seed: int, gpu_memory_utilization: float = 0.3
    ) -> None:
        import vllm  # only here: the module must import without vLLM installed

        self._vllm = vllm
        self.max_new_tokens = max_new_tokens
        self.llm = vllm.LLM(
            model=model_dir,
            tokenizer=model_dir,
            seed=seed,
            dtype="float32",
            gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=True,
            # Allow the sleep/wake_up calls used as onload/offload.
            enable_sleep_mode=True,
        )

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], temperature: float, top_p: float, greedy: bool
    ) -> tuple[list[list[int]], list[list[float]] | None]:
        """Token ids of one response per prompt (EOS included when generated) and, when
        sampling, vLLM's log-prob of each sampled token (``logprobs=0``: the sampled token's
        own, as vLLM's ``logprobs_mode`` computes it)."""
        params = self._vllm.SamplingParams(
            max_tokens=self.max_new_tokens,
            temperature=0.0 if greedy else temperature,
            top_p=1.0 if greedy else top_p,
            top_k=-1,
            logprobs=None if greedy else 0,
        )
        prompts = [{"prompt_token_ids": list(ids)} for ids in prompt_ids]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        tokens = [list(o.outputs[0].token_ids) for o in outputs]
        if greedy:
            return tokens, None
        log_probs = [
            [float(step[t].logprob) for t, step in zip(ids, o.outputs[0].logprobs, strict=True)]
            for ids, o in zip(tokens, outputs, strict=True)
        ]
        return tokens, log_probs

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy new policy weights into the engine's model (model_update, receiving side)."""
        items = list(weights)
        if hasattr(self.llm, "apply_model"):
            self.llm.apply_model(lambda model: model.load_weights(items))
        else:  # older engines expose the model on the driver worker
            executor: Any = self.llm.llm_engine.model_executor
            executor.driver_worker.model_runner.model.load_weights(items)
        if hasattr(self.llm, "reset_prefix_cache"):
            self.llm.reset_prefix_cache()  # cached KV blocks were computed by the old weights

    def sleep(self) -> None:
        """Release the KV cache and offload weights (vLLM sleep level 1)."""
        self.llm.sleep(level=1)

    def wake_up(self) -> None:
        self.llm.wake_up()
