"""Supervised warm-start: teach the random policy the answer format before PPO.

A randomly initialised model never emits a well-formed answer followed by EOS, so the reward
would be flat and PPO would have nothing to follow. A short SFT on training problems (never the
held-out validation ones) gets it to partial accuracy; PPO then has to do the rest.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import LlamaForCausalLM, PreTrainedTokenizerBase

from rlpulse.trainer.config import SFTConfig
from rlpulse.trainer.model import position_ids
from rlpulse.trainer.task import Task


def encode_examples(
    tokenizer: PreTrainedTokenizerBase, prompts: list[str], answers: list[str]
) -> tuple[Tensor, Tensor, Tensor]:
    """Right-padded ``prompt + answer + EOS`` ids, attention mask, and labels that are -100
    everywhere but the answer and EOS (the loss is on the response only)."""
    rows, label_rows = [], []
    for prompt, answer in zip(prompts, answers, strict=True):
        p = tokenizer(prompt, add_special_tokens=False).input_ids
        a = [*tokenizer(answer, add_special_tokens=False).input_ids, tokenizer.eos_token_id]
        rows.append(p + a)
        label_rows.append([-100] * len(p) + a)
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    labels = torch.tensor([r + [-100] * (width - len(r)) for r in label_rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    return ids, mask, labels


def warm_start(
    policy: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    cfg: SFTConfig,
) -> list[float]:
    """Train ``policy`` in place for ``cfg.steps`` steps; returns the loss of each step."""
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr)
    policy.train()
    losses = []
    for _ in range(cfg.steps):
        problems = task.sample(cfg.batch_size)
        ids, mask, labels = encode_examples(
            tokenizer, [p.prompt for p in problems], [p.answer for p in problems]
        )
        out = policy(
            input_ids=ids, attention_mask=mask, position_ids=position_ids(mask), labels=labels
        )
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        optimizer.step()
        losses.append(out.loss.item())
    policy.eval()
    return losses
