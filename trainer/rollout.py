"""Generation with transformers on CPU (or GPU), and turning sequences into a batch.

The vLLM engine (:mod:`rlpulse.trainer.rollout_vllm`) returns token ids too and shares
:func:`assemble_batch`, so both backends produce the same :class:`~rlpulse.trainer.batch.RolloutBatch`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from rlpulse.trainer.batch import RolloutBatch


@dataclass(frozen=True)
class Generation:
    """Generated responses as a batch, their text (up to EOS) and which hit the length cap."""

    batch: RolloutBatch
    responses: list[str]
    truncated: Tensor


def encode_prompts(
    tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str]
) -> tuple[Tensor, Tensor]:
    """Left-padded prompt ids and attention mask (generation appends on the right)."""
    rows = [tokenizer(p, add_special_tokens=False).input_ids for p in prompts]
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def assemble_batch(
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    responses: Sequence[Sequence[int]],
    max_new_tokens: int,
    tokenizer: PreTrainedTokenizerBase,
) -> Generation:
    """Right-pad responses to ``max_new_tokens``; a response ends at (and includes) its first
    EOS. Tokens after EOS are replaced by padding and masked out."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    batch_size = len(responses)
    resp = torch.full((batch_size, max_new_tokens), pad, dtype=torch.long)
    resp_mask = torch.zeros(batch_size, max_new_tokens)
    truncated = torch.zeros(batch_size, dtype=torch.bool)
    texts = []
    for i, tokens in enumerate(responses):
        tokens = list(tokens)[:max_new_tokens]
        if eos in tokens:
            tokens = tokens[: tokens.index(eos) + 1]
        else:
            truncated[i] = True
        resp[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        resp_mask[i, : len(tokens)] = 1.0
        body = tokens[:-1] if not truncated[i] else tokens
        texts.append(tokenizer.decode(body, skip_special_tokens=True))
    batch = RolloutBatch(
        input_ids=torch.cat([prompt_ids, resp], dim=1),
        attention_mask=torch.cat([prompt_mask.float(), resp_mask], dim=1),
        response_mask=resp_mask,
        prompt_width=prompt_ids.shape[1],
    )
    return Generation(batch, texts, truncated)


@torch.no_grad()
def generate_hf(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    greedy: bool,
) -> Generation:
    """Sample (or decode greedily) with ``model.generate``."""
    ids, mask = encode_prompts(tokenizer, prompts)
    device = next(model.parameters()).device
    # An explicit GenerationConfig, so the model's defaults (top_k=50, ...) never apply:
    # the sampling distribution must be the policy's, or PPO's importance ratios are off.
    sampling = {} if greedy else {"temperature": temperature, "top_p": top_p, "top_k": None}
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=not greedy,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **sampling,
    )
    out = model.generate(
        input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=config
    ).cpu()
    responses = [row[ids.shape[1] :].tolist() for row in out]
    return assemble_batch(ids, mask, responses, max_new_tokens, tokenizer)
