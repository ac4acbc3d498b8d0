"""GRPO with Hugging Face TRL, every process streaming to an rlpulse collector.

A tiny Llama built from a config, a character tokenizer and prompts made here, and a reward
for long answers: it runs on a CPU with nothing downloaded. Swap in your model, dataset and
reward functions. ``RlpulseCallback`` alone makes TRL's loss metrics (``loss``, ``entropy``,
``kl``, ``clip_ratio/*_mean``) exact, pooled over every process's tokens; ``ExactGRPOTrainer``
shows the fallback for metrics of your own (advantages, completion lengths).

    python -m rlpulse.collector --config examples/trl/collector.yaml &
    RLPULSE_ADDRESS=tcp://127.0.0.1:5555 python examples/trl/grpo.py --run-name grpo-tiny
    RLPULSE_ADDRESS=tcp://127.0.0.1:5555 torchrun --nproc_per_node 2 examples/trl/grpo.py \\
        --run-name grpo-tiny-2

(``--run-name``, not ``--run``: torchrun's parser refuses an option, even after the script,
that abbreviates two of its own, and ``--run`` could be its ``--run-path`` or ``--run_path``.)
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import torch
from datasets import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase
from trl import GRPOConfig, GRPOTrainer

from rlpulse.producer import Masked
from rlpulse.producer.integrations.trl import RlpulseCallback
from rlpulse.schemas import metrics as M
from rlpulse.trainer.tokenizer import build_tokenizer

PROMPTS = ("abc", "hello", "12+7=", "xyz", "reverse me", "ok", "4*4=", "rl")


class ExactGRPOTrainer(GRPOTrainer):
    """GRPO whose training micro-batches are also logged exactly, from every process: the
    collector pools advantages over the tokens and lengths over the completions of all
    processes and micro-batches of a step."""

    def __init__(self, *args: Any, rlpulse: RlpulseCallback, **kwargs: Any) -> None:
        super().__init__(*args, callbacks=[rlpulse], **kwargs)
        self.rlpulse = rlpulse

    def compute_loss(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        producer = self.rlpulse.producer
        if model.training and producer is not None:
            mask = inputs["completion_mask"]
            advantages = inputs["advantages"].reshape(len(mask), -1).expand_as(mask)
            producer.log(
                {
                    M.CRITIC_ADVANTAGES.name: Masked(advantages, mask),
                    M.RESPONSE_LENGTH.name: mask.sum(1),
                },
                step=self.state.global_step + 1,  # the optimizer step being computed
            )
        return super().compute_loss(model, inputs, *args, **kwargs)


def tiny_model(
    tokenizer: PreTrainedTokenizerBase, seed: int = 0, init_std: float = 0.02
) -> LlamaForCausalLM:
    """A one-layer Llama sized for a CPU, with random weights (nothing downloaded); a larger
    ``init_std`` gives peakier, more varied next-token distributions."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        initializer_range=init_std,
    )
    return LlamaForCausalLM(config)


def reward_length(completions: Sequence[str], **kwargs: Any) -> list[float]:
    """Longer answers score higher (a reward that needs no model)."""
    return [len(c) / 10.0 for c in completions]


def prompts() -> Dataset:
    """A local prompt dataset (TRL's standard, non-conversational format)."""
    return Dataset.from_dict({"prompt": list(PROMPTS) * 4})


def grpo_config(output_dir: str, steps: int = 3, **overrides: Any) -> GRPOConfig:
    """4 completions per prompt, up to 8 tokens; two micro-batches of 4 completions per process
    and optimizer step; a log every step. ``overrides``: other ``GRPOConfig`` fields."""
    settings: dict[str, Any] = dict(
        output_dir=output_dir,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        num_generations=4,
        max_completion_length=8,
        max_steps=steps,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        seed=0,
    )
    return GRPOConfig(**{**settings, **overrides})


def make_trainer(
    rlpulse: RlpulseCallback,
    output_dir: str,
    steps: int = 3,
    trainer_class: type[ExactGRPOTrainer] = ExactGRPOTrainer,
    init_std: float = 0.02,
    **overrides: Any,
) -> ExactGRPOTrainer:
    """The tiny GRPO job, streaming through ``rlpulse`` (``overrides``: ``GRPOConfig`` fields)."""
    tokenizer = build_tokenizer()
    return trainer_class(
        model=tiny_model(tokenizer, init_std=init_std),
        reward_funcs=reward_length,
        args=grpo_config(output_dir, steps, **overrides),
        train_dataset=prompts(),
        processing_class=tokenizer,
        rlpulse=rlpulse,
    )


def arguments() -> argparse.ArgumentParser:
    """The script's options: none may abbreviate two of torchrun's (see the docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-name", default="grpo-tiny", help="the run's name in the collector")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--output-dir", default="runs/grpo-tiny-trl")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = arguments().parse_args(argv)
    trainer = make_trainer(RlpulseCallback(run=args.run_name), args.output_dir, args.steps)
    trainer.train()


if __name__ == "__main__":
    main()
