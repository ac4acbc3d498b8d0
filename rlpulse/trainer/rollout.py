"""Generation with transformers on CPU (or GPU), and turning sequences into a batch.

The vLLM engine (:mod:`rlpulse.trainer.rollout_vllm`) returns token ids too and shares
:func:`assemble_batch`, so both backends produce the same :class:`~rlpulse.trainer.batch.RolloutBatch`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor
from transformers import (
    GenerationConfig,
    LlamaForCausalLM,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedTokenizerBase,
    StoppingCriteria,
    StoppingCriteriaList,
)
from transformers.generation.utils import GenerateDecoderOnlyOutput

from rlpulse.trainer.batch import RolloutBatch
from rlpulse.trainer.model import token_log_probs


@dataclass(frozen=True)
class Generation:
    """Generated responses as a batch, their text (up to EOS) and which hit the length cap.

    ``batch.rollout_log_probs`` holds the engine's own log-prob of each sampled token (None
    for greedy decoding); ``policy_version`` is the step whose weights generated it (the
    rollout worker's latest ``model_update``).
    """

    batch: RolloutBatch
    responses: list[str]
    truncated: Tensor
    policy_version: int = -1
    finished: tuple[float, ...] = ()
    """When each response ended (``time.perf_counter()``), where the backend can tell."""
    lengths: tuple[int, ...] = ()
    """Tokens of each response as generated (its EOS included), before the batch cuts it to
    ``max_new_tokens``."""


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
    log_probs: Sequence[Sequence[float]] | None = None,
) -> Generation:
    """Right-pad responses to ``max_new_tokens``; a response ends at (and includes) its first
    EOS. Tokens after EOS are replaced by padding and masked out. ``log_probs``, the engine's
    log-prob of each generated token, are cut and padded (with 0) the same way."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    batch_size = len(responses)
    resp = torch.full((batch_size, max_new_tokens), pad, dtype=torch.long)
    resp_mask = torch.zeros(batch_size, max_new_tokens)
    rollout_lp = None if log_probs is None else torch.zeros(batch_size, max_new_tokens)
    truncated = torch.zeros(batch_size, dtype=torch.bool)
    texts: list[str] = []
    for i, tokens in enumerate(responses):
        tokens = list(tokens)[:max_new_tokens]
        if eos in tokens:
            tokens = tokens[: tokens.index(eos) + 1]
        else:
            truncated[i] = True
        resp[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        resp_mask[i, : len(tokens)] = 1.0
        if rollout_lp is not None and log_probs is not None:
            rollout_lp[i, : len(tokens)] = torch.tensor(
                list(log_probs[i])[: len(tokens)], dtype=torch.float32
            )
        body = tokens[:-1] if not truncated[i] else tokens
        texts.append(str(tokenizer.decode(body, skip_special_tokens=True)))
    batch = RolloutBatch(
        input_ids=torch.cat([prompt_ids, resp], dim=1),
        attention_mask=torch.cat([prompt_mask.float(), resp_mask], dim=1),
        response_mask=resp_mask,
        prompt_width=prompt_ids.shape[1],
        rollout_log_probs=rollout_lp,
    )
    return Generation(batch, texts, truncated)


class StepTimes(StoppingCriteria):
    """When each generation step ended (``time.perf_counter()``): the ``k``-th token of every
    row came at ``times[k - 1]``. Never stops generation."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: torch.LongTensor, scores: object, **kwargs: object) -> Tensor:
        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


class LongRow(LogitsProcessor):
    """A fault (``TrainerConfig.faults.long_response_step``): row ``row`` cannot end before
    ``tokens`` tokens, every other row ends at ``cap`` (its EOS forced, past the batch's cut
    at ``cap``), so one response is ``tokens`` long while the others keep their length."""

    def __init__(self, row: int, tokens: int, cap: int, eos: int, width: int) -> None:
        self.row, self.tokens, self.cap, self.eos, self.width = row, tokens, cap, eos, width

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        made = input_ids.shape[1] - self.width  # tokens generated so far
        if made < self.tokens - 1:
            scores[self.row, self.eos] = -torch.inf
        if made >= self.cap:
            others = torch.arange(scores.shape[0]) != self.row
            scores[others] = -torch.inf
            scores[others, self.eos] = 0.0
        return scores


def response_lengths(new: Tensor, eos: int) -> tuple[int, ...]:
    """Tokens of each generated row up to and including its first EOS (all of it without)."""
    out = []
    for row in new.tolist():
        out.append(row.index(eos) + 1 if eos in row else len(row))
    return tuple(out)


@torch.no_grad()
def generate_hf(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    greedy: bool,
    long_row: tuple[int, int] | None = None,
) -> Generation:
    """Sample (or decode greedily) with ``model.generate``, noting when each response ended.
    ``long_row``: ``(row, tokens)``, the long-response fault (:class:`LongRow`)."""
    ids, mask = encode_prompts(tokenizer, prompts)
    device = next(model.parameters()).device
    # An explicit GenerationConfig, so the model's defaults (top_k=50, ...) never apply:
    # the sampling distribution must be the policy's, or PPO's importance ratios are off.
    sampling = {} if greedy else {"temperature": temperature, "top_p": top_p, "top_k": None}
    processors = LogitsProcessorList()
    if long_row is not None:
        row, tokens = long_row
        processors.append(
            LongRow(row, tokens, max_new_tokens, tokenizer.eos_token_id, ids.shape[1])
        )
    config = GenerationConfig(
        max_new_tokens=max(max_new_tokens, long_row[1] if long_row else 0),
        do_sample=not greedy,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **sampling,
    )
    steps = StepTimes()
    # transformers types generate() for its generation mixin's self, not the model classes,
    # and returns a union: with return_dict_in_generate a decoder-only model's output.
    generator: Any = model
    out: GenerateDecoderOnlyOutput = generator.generate(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        generation_config=config,
        output_scores=not greedy,
        return_dict_in_generate=True,
        logits_processor=processors,
        stopping_criteria=StoppingCriteriaList([steps]),
    )
    sequences = out.sequences.cpu()
    new = sequences[:, ids.shape[1] :]
    responses = [row.tolist() for row in new]
    lengths = response_lengths(new, tokenizer.eos_token_id)
    log_probs = None
    if not greedy:
        # The engine's log-prob of each token it sampled, under the distribution it sampled
        # from: generate's scores are the logits after temperature and top_p, one (B, V) per
        # new token. The trainer scores the same tokens with a full forward pass at
        # temperature 1; rollout/logprob_diff is the difference.
        scores = (
            torch.stack(cast("tuple[Tensor, ...]", out.scores), dim=1).float().cpu()
        )  # (B, new tokens, V)
        log_probs = token_log_probs(scores, new[:, : scores.shape[1]]).tolist()
    gen = assemble_batch(ids, mask, responses, max_new_tokens, tokenizer, log_probs)
    finished = tuple(steps.times[min(n, len(steps.times)) - 1] for n in lengths)
    return dataclasses.replace(gen, finished=finished, lengths=lengths)
