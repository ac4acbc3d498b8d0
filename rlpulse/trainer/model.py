"""The models: a tiny Llama policy built from a config, and a critic with a value head.

Nothing is downloaded: weights are randomly initialised from a seed (then warm-started by SFT,
see :mod:`rlpulse.trainer.sft`). The forward helpers score the response columns of a
:class:`~rlpulse.trainer.batch.RolloutBatch`: the logits at position ``p`` predict token ``p + 1``, so
response token ``j`` (column ``P + j``) is scored by position ``P + j - 1``; the critic's value
for that token is read at the same position (the state before the token was chosen).

>>> from rlpulse.trainer.config import ModelConfig
>>> from rlpulse.trainer.tokenizer import build_tokenizer
>>> policy = build_policy(ModelConfig(hidden_size=16, intermediate_size=32, num_heads=2), build_tokenizer(), seed=0)
>>> type(ValueModel.from_policy(policy).head).__name__
'Linear'
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import LlamaConfig, LlamaForCausalLM, LlamaModel, PreTrainedTokenizerBase

from rlpulse.trainer.config import ModelConfig


def llama_config(cfg: ModelConfig, tokenizer: PreTrainedTokenizerBase) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        attention_dropout=0.0,
    )


def build_policy(
    cfg: ModelConfig, tokenizer: PreTrainedTokenizerBase, seed: int
) -> LlamaForCausalLM:
    """A randomly initialised causal LM; the same seed gives the same weights."""
    torch.manual_seed(seed)
    return LlamaForCausalLM(llama_config(cfg, tokenizer))


class ValueModel(nn.Module):
    """A Llama backbone with a scalar head: one value per position.

    >>> # ValueModel.from_policy(policy)(input_ids, attention_mask) -> (batch, length)
    """

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.backbone = LlamaModel(config)
        self.head = nn.Linear(config.hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    @classmethod
    def from_policy(cls, policy: LlamaForCausalLM) -> ValueModel:
        """A critic whose backbone starts as a copy of the policy's (the usual PPO init)."""
        critic = cls(policy.config)
        critic.backbone.load_state_dict(policy.model.state_dict())
        return critic

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        hidden = self.backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids(attention_mask),
        ).last_hidden_state
        return self.head(hidden).squeeze(-1)


def position_ids(attention_mask: Tensor) -> Tensor:
    """Positions counted over real tokens, so a left-padded prompt starts at 0 (as in generate)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def _response_slice(prompt_width: int, response_width: int) -> slice:
    return slice(prompt_width - 1, prompt_width + response_width - 1)


def response_logits(
    model: LlamaForCausalLM, input_ids: Tensor, attention_mask: Tensor, prompt_width: int
) -> Tensor:
    """Logits that predict each response token: shape (batch, response_width, vocab)."""
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids(attention_mask),
    ).logits
    width = input_ids.shape[1] - prompt_width
    return logits[:, _response_slice(prompt_width, width)].float()


def token_log_probs(logits: Tensor, tokens: Tensor) -> Tensor:
    """log p(token) under ``logits``; shapes (B, T, V) and (B, T) -> (B, T)."""
    return torch.gather(F.log_softmax(logits, dim=-1), -1, tokens.unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the categorical distribution at each position: (B, T, V) -> (B, T)."""
    logp = F.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def response_values(
    critic: ValueModel, input_ids: Tensor, attention_mask: Tensor, prompt_width: int
) -> Tensor:
    """The critic's value for each response token: (batch, response_width)."""
    values = critic(input_ids, attention_mask)
    width = input_ids.shape[1] - prompt_width
    return values[:, _response_slice(prompt_width, width)].float()
