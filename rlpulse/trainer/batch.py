"""The rollout batch that moves between the driver and the workers, and how it is split.

Layout: ``input_ids`` is ``[left-padded prompt | right-padded response]``, ``prompt_width``
columns of prompt and ``response_mask.shape[1]`` columns of response. Per-token fields
(``old_log_probs``, ``advantages``, ...) cover the response columns only; per-sample fields
(``scores``, ``valid``, ...) have one entry per row. Fields a stage has not filled yet are None.

>>> import torch
>>> b = RolloutBatch(torch.zeros(8, 3, dtype=torch.long), torch.ones(8, 3), torch.ones(8, 1), 2)
>>> [int(i) for i in shard_indices(8, rank=1, world_size=2, mini_batches=2)]
[2, 3, 6, 7]
>>> b.select(torch.tensor([0, 1])).size
2
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


@dataclass(frozen=True)
class RolloutBatch:
    """A batch of prompt/response pairs and everything computed about them."""

    input_ids: Tensor
    attention_mask: Tensor
    response_mask: Tensor
    prompt_width: int
    scores: Tensor | None = None
    rewards: Tensor | None = None
    valid: Tensor | None = None
    positive: Tensor | None = None
    sample_weights: Tensor | None = None
    rollout_log_probs: Tensor | None = None
    """The rollout engine's log-prob of each response token, as it sampled it (None when the
    engine gives none); set by the rollout."""
    old_log_probs: Tensor | None = None
    ref_log_probs: Tensor | None = None
    values: Tensor | None = None
    advantages: Tensor | None = None
    returns: Tensor | None = None

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def prompt_lengths(self) -> Tensor:
        """Real (unpadded) prompt tokens per sample."""
        return self.attention_mask[:, : self.prompt_width].sum(-1)

    @property
    def response_lengths(self) -> Tensor:
        return self.response_mask.sum(-1)

    @property
    def loss_mask(self) -> Tensor:
        """Response tokens that count in losses: the response mask of valid samples."""
        if self.valid is None:
            return self.response_mask
        return self.response_mask * self.valid.to(self.response_mask.dtype).unsqueeze(-1)

    def replace(self, **changes: Any) -> RolloutBatch:
        return dataclasses.replace(self, **changes)

    def select(self, index: Tensor) -> RolloutBatch:
        """The rows ``index`` of every tensor field."""
        changes: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Tensor):
                changes[f.name] = value[index]
        return dataclasses.replace(self, **changes)

    def split(self, parts: int) -> list[RolloutBatch]:
        """``parts`` consecutive equal slices (the size must divide evenly)."""
        if self.size % parts:
            raise ValueError(f"batch of {self.size} does not split into {parts} equal parts")
        step = self.size // parts
        return [self.select(torch.arange(i * step, (i + 1) * step)) for i in range(parts)]


def shard_indices(size: int, rank: int, world_size: int, mini_batches: int) -> Tensor:
    """Rows of a global batch that one data-parallel rank trains on.

    The global batch is cut into ``mini_batches`` consecutive mini-batches and each of those
    into ``world_size`` slices; a rank gets its slice of every mini-batch, in order. A rank that
    splits its shard into ``mini_batches`` parts then holds its slice of global mini-batch i at
    part i, so one rank and N ranks optimise on exactly the same mini-batches.
    """
    if size % (world_size * mini_batches):
        raise ValueError(
            f"batch of {size} does not split over {world_size} ranks x {mini_batches} mini-batches"
        )
    per_mb = size // mini_batches
    per_rank = per_mb // world_size
    rows = [
        torch.arange(m * per_mb + rank * per_rank, m * per_mb + (rank + 1) * per_rank)
        for m in range(mini_batches)
    ]
    return torch.cat(rows)


def shard(batch: RolloutBatch, rank: int, world_size: int, mini_batches: int) -> RolloutBatch:
    return batch.select(shard_indices(batch.size, rank, world_size, mini_batches))


def concat_rows(parts: list[Tensor], index: list[Tensor], size: int) -> Tensor:
    """Reassemble per-rank results ``parts`` (rows ``index[r]`` of the global batch)."""
    out = torch.empty((size, *parts[0].shape[1:]), dtype=parts[0].dtype)
    for rows, part in zip(index, parts, strict=True):
        out[rows] = part
    return out
