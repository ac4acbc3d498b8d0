"""The sample rows the trainer will log: per-sample means over the response tokens only, the
rollout/trainer log-prob mismatch as a mean absolute difference, lengths and staleness, on a
hand-made batch whose expected values are worked out below; and rows of a generated batch
that the samples reduction keeps whole."""

from __future__ import annotations

import pytest
import torch

from rlpulse.schemas.samples import reduce_rows
from rlpulse.trainer.batch import RolloutBatch
from rlpulse.trainer.rollout import Generation
from rlpulse.trainer.samples import ROLLOUT_KEY, VALIDATION_KEY, rollout_rows, validation_rows

PROMPTS = ["2+2=", "3+4=", "9+9="]
RESPONSES = ["4", "7", ""]
# Three samples, four response columns: 3 response tokens, 2, and none (an empty response).
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
# The padding columns hold large values: any of them leaking into a mean shows.
ADVANTAGES = torch.tensor([[0.5, 1.0, 1.5, 100.0], [-2.0, 0.0, 7.0, 7.0], [3.0, 3.0, 3.0, 3.0]])
ROLLOUT_LP = torch.tensor([[-1.0, -0.5, -2.0, 0.0], [-0.1, -0.2, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
OLD_LP = torch.tensor(
    [[-1.5, -0.5, -1.0, -9.0], [-0.3, -0.1, -5.0, -5.0], [-1.0, -1.0, -1.0, -1.0]]
)


def batch(**changes: object) -> RolloutBatch:
    fields: dict[str, object] = {
        "input_ids": torch.zeros(3, 6, dtype=torch.long),
        "attention_mask": torch.ones(3, 6),
        "response_mask": MASK,
        "prompt_width": 2,
        "scores": torch.tensor([1.0, 0.25, 0.0]),
        # Normalised rewards differ from the scores: the rows must carry the scores.
        "rewards": torch.tensor([0.9, -0.1, -0.8]),
        "advantages": ADVANTAGES,
        "old_log_probs": OLD_LP,
        "rollout_log_probs": ROLLOUT_LP,
    }
    fields.update(changes)
    return RolloutBatch(**fields)  # type: ignore[arg-type]


def generation(b: RolloutBatch, policy_version: int = 4) -> Generation:
    return Generation(b, list(RESPONSES), torch.zeros(3, dtype=torch.bool), policy_version)


def test_rollout_rows_by_hand() -> None:
    b = batch()
    rows = rollout_rows(PROMPTS, generation(b), b, step=6)
    # advantage, over each row's masked tokens: (0.5 + 1 + 1.5) / 3 = 1; (-2 + 0) / 2 = -1;
    # none for the empty response.
    # logprob_mismatch, |rollout - old| over the same tokens: (0.5 + 0 + 1) / 3 = 0.5;
    # (0.2 + 0.1) / 2 = 0.15; none.
    # staleness: step 6 trains a batch the weights of step 4 generated: 2.
    assert [r["prompt"] for r in rows] == PROMPTS
    assert [r["response"] for r in rows] == RESPONSES
    assert [r["reward"] for r in rows] == [1.0, 0.25, 0.0]
    assert [r["response_length"] for r in rows] == [3, 2, 0]
    assert rows[0]["advantage"] == pytest.approx(1.0)
    assert rows[1]["advantage"] == pytest.approx(-1.0)
    assert rows[2]["advantage"] is None
    assert rows[0]["logprob_mismatch"] == pytest.approx(0.5)
    assert rows[1]["logprob_mismatch"] == pytest.approx(0.15)
    assert rows[2]["logprob_mismatch"] is None
    assert [r["staleness"] for r in rows] == [2, 2, 2]
    assert all(type(r["response_length"]) is int for r in rows)
    assert list(rows[0]) == [
        "prompt",
        "response",
        "reward",
        "advantage",
        "response_length",
        "logprob_mismatch",
        "staleness",
    ]


def test_mismatch_is_absolute_so_opposite_errors_do_not_cancel() -> None:
    """Row 0's engine log-probs are 0.5 above the trainer's on one token and 0.5 below on the
    other: a signed mean would say 0, the absolute one says 0.5."""
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0]] * 3)
    old = torch.full((3, 4), -1.0)
    engine = torch.tensor([[-0.5, -1.5, 0.0, 0.0]] * 3)
    b = batch(response_mask=mask, old_log_probs=old, rollout_log_probs=engine)
    rows = rollout_rows(PROMPTS, generation(b), b, step=4)
    assert [r["logprob_mismatch"] for r in rows] == pytest.approx([0.5] * 3)
    assert rows[0]["staleness"] == 0


def test_without_engine_log_probs_or_a_policy_version_those_fields_are_none() -> None:
    b = batch(rollout_log_probs=None)
    rows = rollout_rows(PROMPTS, generation(b, policy_version=-1), b, step=3)
    assert all(r["logprob_mismatch"] is None and r["staleness"] is None for r in rows)
    assert rows[0]["advantage"] == pytest.approx(1.0)


def test_called_too_early_or_with_misaligned_inputs_says_so() -> None:
    b = batch(advantages=None)
    with pytest.raises(ValueError, match="after the advantage stage"):
        rollout_rows(PROMPTS, generation(b), b, step=0)
    b = batch()
    with pytest.raises(ValueError, match="2 prompts, 3 responses and 3 batch rows"):
        rollout_rows(PROMPTS[:2], generation(b), b, step=0)


def test_validation_rows() -> None:
    b = batch()
    rows = validation_rows(PROMPTS, generation(b), [1.0, 0.5, 0.0])
    assert rows == [
        {"prompt": p, "response": r, VALIDATION_KEY: s}
        for p, r, s in zip(PROMPTS, RESPONSES, [1.0, 0.5, 0.0], strict=True)
    ]
    with pytest.raises(ValueError, match="3 prompts, 3 responses and 2 scores"):
        validation_rows(PROMPTS, generation(b), [1.0, 0.5])


def test_rows_of_a_generated_batch_are_kept_whole_by_the_samples_reduction(
    filled_batch: RolloutBatch,
) -> None:
    """The conftest's batch, generated and filled as the driver fills it (engine log-probs
    included): every row passes the reduction's checks, none is dropped or cut."""
    n = filled_batch.size
    gen = Generation(filled_batch, [f"r{i}" for i in range(n)], torch.zeros(n, dtype=torch.bool), 0)
    rows = rollout_rows([f"p{i}" for i in range(n)], gen, filled_batch, step=0)
    assert all(isinstance(r["logprob_mismatch"], float) for r in rows)
    state = reduce_rows(rows, ROLLOUT_KEY, origin=("driver", 0))
    assert (state.rows, state.dropped, state.cut) == (n, 0, 0)
    lengths = filled_batch.response_lengths.tolist()
    assert [r["response_length"] for r in rows] == [int(x) for x in lengths]
