"""A demo-size policy checkpoint for the serving tests, built from a config (nothing
downloaded) and saved as the trainer exports one: ``save_pretrained`` of the model and of
the locally built tokenizer."""

from __future__ import annotations

from pathlib import Path

import torch

from rlpulse.trainer.config import ModelConfig
from rlpulse.trainer.model import build_policy
from rlpulse.trainer.tokenizer import build_tokenizer

PROMPTS = ("abc>", "ba>", "dcab>", "e>", "cc>", "abcde>", "12+7=", "bad>")
"""Prompts of different lengths, so a batch of them is left-padded."""


def make_checkpoint(directory: Path, seed: int = 0) -> Path:
    """Write a demo-size Llama (``trainer/configs/demo.yaml``'s sizes, ModelConfig's defaults)
    and its tokenizer to ``directory``; returns it.

    The output layer is scaled up so that greedy decoding has no near-ties: a random model's
    logits are almost flat, and the float rounding of a padded batch could flip an argmax
    between two tokens that differ by 1e-7, which would make "the same answer alone and in a
    batch" a coin toss rather than a check."""
    tokenizer = build_tokenizer()
    policy = build_policy(ModelConfig(), tokenizer, seed=seed)
    with torch.no_grad():
        policy.lm_head.weight.mul_(50.0)
    directory.mkdir(parents=True, exist_ok=True)
    policy.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
