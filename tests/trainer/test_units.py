"""Config, batch sharding, task, tokenizer, diversity and metric naming."""

from __future__ import annotations

import pytest
import torch

from rlpulse.schemas.metrics import CATALOG
from rlpulse.trainer import emit
from rlpulse.trainer.batch import RolloutBatch, concat_rows, shard, shard_indices
from rlpulse.trainer.config import ConfigError, load_config
from rlpulse.trainer.diversity import distinct_n, repetition
from rlpulse.trainer.rollout import assemble_batch
from rlpulse.trainer.task import ReverseTask, is_correct, score
from rlpulse.trainer.tokenizer import build_tokenizer


def test_overrides_and_config_errors_name_the_field() -> None:
    cfg = load_config("trainer/configs/reverse.yaml", ["steps=3", "ppo.value_clip=null"])
    assert cfg.steps == 3 and cfg.ppo.value_clip is None
    with pytest.raises(ConfigError) as err:
        load_config(None, ["ppo.clip_lo=0.1"])
    assert err.value.field == "ppo.clip_lo"
    with pytest.raises(ConfigError) as err:
        load_config(None, ["ppo.batch_size=30"])  # not a multiple of 2 ranks x 2 mini-batches
    assert err.value.field == "ppo.batch_size"
    with pytest.raises(ConfigError) as err:
        load_config(None, ["ppo.algorithm=grpo"])  # GRPO needs the KL in the loss
    assert err.value.field == "ppo.kl_placement"


def test_loss_mode_dual_clip_and_scale_are_validated() -> None:
    cfg = load_config(None, ["ppo.loss_agg_mode=seq-mean-token-sum-norm", "ppo.clip_ratio_c=null"])
    assert cfg.ppo.loss_agg_mode == "seq-mean-token-sum-norm" and cfg.ppo.clip_ratio_c is None
    assert load_config(None).ppo.clip_ratio_c == 3.0  # verl's default: the dual clip is on
    for bad, field in (
        ("ppo.loss_agg_mode=seq-mean", "ppo.loss_agg_mode"),
        ("ppo.clip_ratio_c=1.0", "ppo.clip_ratio_c"),
        ("ppo.loss_scale_factor=0", "ppo.loss_scale_factor"),
    ):
        with pytest.raises(ConfigError) as err:
            load_config(None, [bad])
        assert err.value.field == field


def test_shards_partition_every_global_mini_batch() -> None:
    idx = [shard_indices(12, r, 3, 2) for r in range(3)]
    assert sorted(torch.cat(idx).tolist()) == list(range(12))
    # rank r's part i is its slice of global mini-batch i (rows 0-5, then 6-11)
    assert [p.tolist() for p in idx[1].split(2)] == [[2, 3], [8, 9]]
    with pytest.raises(ValueError):
        shard_indices(10, 0, 3, 2)
    parts = [torch.tensor(i.tolist()) * 10 for i in idx]
    assert concat_rows(parts, idx, 12).tolist() == [i * 10 for i in range(12)]
    b = RolloutBatch(torch.arange(12).unsqueeze(-1), torch.ones(12, 1), torch.ones(12, 1), 1)
    assert shard(b, 2, 3, 2).input_ids.squeeze(-1).tolist() == [4, 5, 10, 11]


def test_assemble_batch_cuts_at_eos_and_flags_truncation() -> None:
    tok = build_tokenizer()
    eos, pad = tok.eos_token_id, tok.pad_token_id
    a, b = tok.convert_tokens_to_ids(["a", "b"])
    prompt = torch.tensor([[pad, a], [a, b]])
    gen = assemble_batch(prompt, (prompt != pad).long(), [[a, eos, b], [b, b, b]], 3, tok)
    assert gen.responses == ["a", "bbb"]
    assert gen.truncated.tolist() == [False, True]
    assert gen.batch.response_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert gen.batch.input_ids[0, 4].item() == pad  # the token after EOS is padding
    assert gen.batch.prompt_lengths.tolist() == [1, 2]


def test_reverse_task_and_verifier() -> None:
    task = ReverseTask(letters=3, min_len=2, max_len=3, val_prompts=5, seed=0)
    assert len(task.val) == 5 and len(task.train) == 9 + 27 - 5
    assert not {p.prompt for p in task.val} & {p.prompt for p in task.train}
    p = task.sample(1)[0]
    assert p.answer == p.prompt[:-1][::-1]
    assert score("cba", "cba") == 1.0 and is_correct("cba ", "cba")
    assert score("cbb", "cba") == pytest.approx(0.5 * 2 / 3)


def test_tokenizer_round_trips_through_save_pretrained(tmp_path) -> None:
    from transformers import AutoTokenizer

    tok = build_tokenizer()
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again("ab+1=").input_ids == tok("ab+1=").input_ids
    assert again.decode(tok("dcba").input_ids) == "dcba"


def test_diversity() -> None:
    assert distinct_n(["abab", "ab"], 2) == (2, 4)  # ab, ba | ab, ba, ab, ab
    assert repetition(["abab", "ab"], 2) == (1, 4)  # the second "ab" of "abab"
    assert distinct_n([], 1) == (0, 0)


def test_emitted_names_are_catalog_names() -> None:
    out = emit.validation([0.5, 1.0], [False, True], {1: (3, 4), 2: (2, 3)}, (0, 3))
    out.update(emit.stage_times({"time/adv": 0.1}))
    for name in out:
        assert CATALOG.resolve(name).known, name
    with pytest.raises(KeyError):
        emit.stage_times({"time/not_a_stage": 1.0})
