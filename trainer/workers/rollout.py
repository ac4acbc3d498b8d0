"""rollout: generates responses. transformers ``generate`` on CPU; vLLM on a GPU when installed."""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch

from rlpulse.schemas.topology import GENERATE, MODEL_UPDATE, ROLLOUT
from rlpulse.trainer.model import build_policy
from rlpulse.trainer.offload import StateMover
from rlpulse.trainer.rollout import Generation, assemble_batch, encode_prompts, generate_hf
from rlpulse.trainer.rollout_vllm import VLLMEngine, vllm_available
from rlpulse.trainer.workers.base import Worker, WorkerSpec


class RolloutWorker(Worker):
    """Holds the inference copy of the policy; ``update_weights`` syncs it from actor_train."""

    role = ROLLOUT

    def __init__(self, spec: WorkerSpec, weights: dict[str, torch.Tensor]) -> None:
        super().__init__(spec)
        backend = self.cfg.rollout.backend
        if backend == "vllm" and not vllm_available():
            raise RuntimeError("rollout.backend is vllm but vLLM or a CUDA device is missing")
        self.use_vllm = backend == "vllm" or (backend == "auto" and vllm_available())
        self.model = build_policy(self.cfg.model, self.tokenizer, seed=self.cfg.seed)
        self.model.load_state_dict(weights)
        self.model.eval().requires_grad_(False)
        self.engine: VLLMEngine | None = None
        self.policy_version = -1
        """The step whose weights the engine holds (its latest model_update)."""
        if self.use_vllm:
            # vLLM starts from a HuggingFace directory; later weights arrive in memory.
            model_dir = tempfile.mkdtemp(prefix="rlpulse-vllm-")
            self.model.save_pretrained(model_dir)
            self.tokenizer.save_pretrained(model_dir)
            self.engine = VLLMEngine(model_dir, self.cfg.rollout.max_new_tokens, self.cfg.seed)
            self.mover = None
        else:
            self.mover = StateMover(self.model, None, self.device, enabled=self.cfg.cluster.offload)

    @property
    def backend(self) -> str:
        return "vllm" if self.use_vllm else "hf"

    def _phase(self, name: str, step: int) -> AbstractContextManager[Any]:
        if self.engine is not None:
            engine = self.engine
            return self.producer.phase(
                f"{self.role}/{name}", step=step, onload=engine.wake_up, offload=engine.sleep
            )
        return self.phase(name, step, self.mover)

    def update_weights(self, step: int, weights: dict[str, torch.Tensor]) -> bool:
        """model_update, receiving side: load the trainer's latest policy weights."""
        with self._phase(MODEL_UPDATE, step):
            if self.engine is not None:
                self.engine.load_weights(weights.items())
            else:
                self.model.load_state_dict(weights)
        self.policy_version = step
        return True

    def generate(self, step: int, prompts: Sequence[str], greedy: bool = False) -> Generation:
        cfg = self.cfg.rollout
        with self._phase(GENERATE, step):
            if self.engine is not None:
                ids, mask = encode_prompts(self.tokenizer, prompts)
                rows = [row[m.bool()].tolist() for row, m in zip(ids, mask, strict=True)]
                responses, log_probs = self.engine.generate(
                    rows, cfg.temperature, cfg.top_p, greedy
                )
                out = assemble_batch(
                    ids, mask, responses, cfg.max_new_tokens, self.tokenizer, log_probs
                )
            else:
                out = generate_hf(
                    self.model,
                    self.tokenizer,
                    prompts,
                    max_new_tokens=cfg.max_new_tokens,
                    temperature=cfg.temperature,
                    top_p=cfg.top_p,
                    greedy=greedy,
                )
        return dataclasses.replace(out, policy_version=self.policy_version)
