"""What a training generation logs for the step ledger's rollout tail (when each response
ended, the longest response), on the HF path and the in-process vLLM engine, and the
long-response fault on both; the fault switches' checks."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from rlpulse.schemas.errors import ConfigError
from rlpulse.schemas.rollout import ROLLOUT_RESPONSE_FINISH, ROLLOUT_RESPONSE_LONGEST
from rlpulse.trainer.config import load_config
from rlpulse.trainer.faults import FaultsConfig
from rlpulse.trainer.model import build_policy
from rlpulse.trainer.rollout import generate_hf
from rlpulse.trainer.workers.rollout import response_metrics

MAX_NEW = 6
PROMPTS = ["ab>", "cab>", "dcab>", "ba>", "eda>", "a>"] * 4


def test_hf_notes_when_each_response_ended_and_the_fault_makes_one_ten_times_longer(
    tiny_cfg: Any, tokenizer: Any
) -> None:
    policy = build_policy(tiny_cfg.model, tokenizer, seed=0)
    started = time.perf_counter()
    plain = generate_hf(
        policy, tokenizer, PROMPTS, max_new_tokens=MAX_NEW, temperature=1.0, top_p=1.0, greedy=False
    )
    assert len(plain.finished) == len(plain.lengths) == len(PROMPTS)
    assert all(1 <= n <= MAX_NEW for n in plain.lengths)
    # a response that ended sooner has an earlier end; none before the call began
    order = np.argsort(plain.lengths, kind="stable")
    ends = np.asarray(plain.finished)[order]
    assert (np.diff(ends) >= 0).all() and ends[0] > started
    logged = response_metrics(plain, started)
    assert logged[ROLLOUT_RESPONSE_LONGEST.name] == max(plain.lengths)
    assert np.allclose(logged[ROLLOUT_RESPONSE_FINISH.name], np.asarray(plain.finished) - started)

    long = generate_hf(
        policy,
        tokenizer,
        PROMPTS,
        max_new_tokens=MAX_NEW,
        temperature=1.0,
        top_p=1.0,
        greedy=False,
        long_row=(0, 10 * MAX_NEW),
    )
    assert long.lengths[0] == 10 * MAX_NEW
    assert all(n <= MAX_NEW + 1 for n in long.lengths[1:])
    assert long.finished[0] == max(long.finished)
    assert long.batch.response_mask.shape[1] == MAX_NEW, "the batch still cuts it"
    assert bool(long.truncated[0])


def test_the_vllm_engine_notes_when_each_request_finished(vllm_engine: Any, tokenizer: Any) -> None:
    vllm_engine.take_raw()  # whatever earlier tests left
    rows = [tokenizer(p, add_special_tokens=False).input_ids for p in PROMPTS]
    started = time.perf_counter()
    tokens, _ = vllm_engine.generate(rows, 1.0, 1.0, greedy=False, long_row=(2, 40))
    _, samples = vllm_engine.take_raw()
    assert len(tokens[2]) == 40 and all(len(t) <= 8 for i, t in enumerate(tokens) if i != 2)
    assert len(samples.finished) == len(rows)
    assert min(samples.finished) > started
    # the long request finished last, alone, after the others
    assert max(samples.finished) > sorted(samples.finished)[-2]


def test_fault_switches_are_checked_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r"faults\.slow_reward_s"):
        FaultsConfig(slow_reward_s=0)
    with pytest.raises(ConfigError, match=r"faults\.slow_train_rank"):
        load_config(None, ["faults.slow_train_step=2", "faults.slow_train_rank=2"])
    with pytest.raises(ConfigError, match=r"faults\.long_response_factor"):
        load_config(None, ["faults.long_response_step=2"])  # 60 tokens do not fit 64
    cfg = load_config(None, ["faults.long_response_step=2", "rollout.max_new_tokens=4"])
    assert cfg.faults.long_tokens(cfg.rollout.max_new_tokens) == 40
    faults = FaultsConfig(slow_train_step=3, slow_train_rank=1)
    assert faults.delay("slow_train", 3, rank=1) == 1.0
    assert faults.delay("slow_train", 3, rank=0) == faults.delay("slow_train", 2, rank=1) == 0.0
