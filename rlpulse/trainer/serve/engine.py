"""The model behind ``/generate``: loading a checkpoint, and generating for a batch of requests.

The checkpoint is what the trainer exports (``save_pretrained`` of the policy and its
tokenizer), loaded with ``AutoModelForCausalLM`` and ``AutoTokenizer``. A batch mixes requests
with different prompts, lengths, temperatures and token limits: prompts are left-padded as
the rollout workers pad them (``rlpulse.trainer.rollout.encode_prompts``), each row is sampled at its
own temperature (0: greedy) by a logits processor, and a row stops at its own EOS or token
limit while the others go on.

>>> # engine = Engine.load("runs/demo/checkpoint-29/actor", device="auto")
>>> # engine.generate([Job(...), Job(...)]) -> [Answer(...), Answer(...)]
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    StoppingCriteria,
    StoppingCriteriaList,
)

from rlpulse.schemas.errors import ConfigError
from rlpulse.trainer.rollout import encode_prompts
from rlpulse.trainer.serve.requests import GenerateRequest


@dataclass
class Job:
    """One request on its way through the queue; the batcher sets ``future`` to its
    :class:`Answer` (or to the exception that stopped it)."""

    request: GenerateRequest
    prompt_tokens: int
    queued_at: float = 0.0
    """Monotonic seconds when it entered the queue."""
    future: Future[Answer] = field(default_factory=Future, repr=False)


@dataclass(frozen=True)
class Answer:
    """What one request generated: the text up to EOS, its tokens and why it stopped."""

    text: str
    tokens: int
    """Generated tokens, EOS included when it was generated."""
    finish_reason: str
    """``eos`` (the model ended the answer) or ``length`` (max_new_tokens was reached)."""


class RowTemperature(LogitsProcessor):
    """Scales each row's logits by its own temperature; a row at temperature 0 keeps only its
    most likely token, so sampling picks it (greedy) while the other rows sample."""

    def __init__(self, temperatures: Tensor) -> None:
        self.greedy = temperatures == 0
        self.scale = torch.where(self.greedy, torch.ones_like(temperatures), temperatures)[:, None]

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        scores = scores / self.scale.to(scores.dtype)
        if bool(self.greedy.any()):
            best = scores.argmax(dim=-1, keepdim=True)
            only_best = torch.full_like(scores, float("-inf")).scatter(1, best, 0.0)
            scores = torch.where(self.greedy[:, None], only_best, scores)
        return scores


class RowLimit(StoppingCriteria):
    """Marks a row done once it has generated its own ``max_new_tokens``."""

    def __init__(self, prompt_width: int, limits: Tensor) -> None:
        self.prompt_width = prompt_width
        self.limits = limits

    def __call__(self, input_ids: Tensor, scores: Tensor, **kwargs: object) -> Tensor:
        return (input_ids.shape[1] - self.prompt_width) >= self.limits


class Engine:
    """A causal LM and its tokenizer on one device, generating for batches of jobs.

    ``generate`` runs on one thread (the batcher's); ``encode`` may run on others (the request
    handlers), so the tokenizer is used under a lock.
    """

    def __init__(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, device: torch.device
    ) -> None:
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ConfigError("model", "the tokenizer needs a pad and an eos token")
        self.model = model.to(device).eval()  # type: ignore[arg-type]  # transformers' wrapped .to
        self.tokenizer = tokenizer
        self.device = device
        self.context = int(getattr(model.config, "max_position_embeddings", 0) or 0)
        """Tokens the model can attend to: prompt plus generated tokens."""
        if self.context < 2:
            raise ConfigError("model", "the model config has no max_position_embeddings")
        self._tokenizer_lock = threading.Lock()

    @classmethod
    def load(cls, path: str | Path, device: str = "auto") -> Engine:
        """Load a HuggingFace checkpoint directory; ConfigError names what is wrong with it."""
        directory = Path(path)
        if not (directory / "config.json").is_file():
            raise ConfigError(
                "model",
                "is not a HuggingFace checkpoint directory (no config.json); `make demo` "
                "exports one to runs/demo/checkpoint-<step>/actor",
                str(path),
            )
        if device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("device", "cuda was asked for, but torch sees no GPU", device)
        chosen = torch.device(
            "cuda"
            if device == "cuda" or (device == "auto" and torch.cuda.is_available())
            else "cpu"
        )
        try:
            tokenizer = AutoTokenizer.from_pretrained(directory)
            model = AutoModelForCausalLM.from_pretrained(directory)
        except (OSError, ValueError) as exc:
            raise ConfigError("model", f"cannot load the checkpoint: {exc}", str(path)) from None
        return cls(model, tokenizer, chosen)

    def encode(self, prompt: str) -> list[int]:
        """The prompt's token ids, as the rollout workers tokenize prompts (no special tokens)."""
        with self._tokenizer_lock:
            return list(self.tokenizer(prompt, add_special_tokens=False).input_ids)

    @torch.inference_mode()
    def generate(self, jobs: Sequence[Job]) -> list[Answer]:
        """Generate for every job in one model call; answers in the jobs' order."""
        if not jobs:
            return []
        tok = self.tokenizer
        with self._tokenizer_lock:
            ids, mask = encode_prompts(tok, [j.request.prompt for j in jobs])
        temperatures = torch.tensor([j.request.temperature for j in jobs], dtype=torch.float32)
        limits = torch.tensor([j.request.max_new_tokens for j in jobs])
        greedy = bool((temperatures == 0).all())
        config = GenerationConfig(
            max_new_tokens=int(limits.max()),
            do_sample=not greedy,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
            **({} if greedy else {"temperature": 1.0, "top_p": 1.0, "top_k": None}),
        )
        processors = LogitsProcessorList(
            [] if greedy else [RowTemperature(temperatures.to(self.device))]
        )
        stopping = StoppingCriteriaList([RowLimit(ids.shape[1], limits.to(self.device))])
        out = self.model.generate(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            generation_config=config,
            logits_processor=processors,
            stopping_criteria=stopping,
        ).cpu()
        answers = []
        for row, job in zip(out[:, ids.shape[1] :].tolist(), jobs, strict=True):
            answers.append(self._answer(row[: job.request.max_new_tokens]))
        return answers

    def _answer(self, tokens: list[int]) -> Answer:
        eos = self.tokenizer.eos_token_id
        if eos in tokens:
            body = tokens[: tokens.index(eos)]
            count, reason = len(body) + 1, "eos"
        else:
            body, count, reason = tokens, len(tokens), "length"
        with self._tokenizer_lock:
            text = self.tokenizer.decode(body, skip_special_tokens=True)
        return Answer(str(text), count, reason)
