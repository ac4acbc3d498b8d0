"""The vLLM rollout engine on this machine's CPU, in process (one engine for the session):
generation, the weight push into the running engine, the engine's own metrics, and
``rollout/logprob_diff`` catching what it exists to catch (a prefix cache left stale by a
weight push; a bfloat16 engine against the float32 trainer).

Log-prob differences go through the trainer's own path: the engine's tokens become a batch
(``assemble_batch``), the trainer rescores it (``PolicyTrainer.log_probs``), ``emit`` makes the
metric and the collector's aggregator merges it (``collect``), so the figures asserted are the
``rollout/logprob_diff`` a run reports.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from rlpulse.schemas import engine as E, metrics as m, sketch
from rlpulse.trainer import emit
from rlpulse.trainer.config import PPOConfig
from rlpulse.trainer.engine_stats import step_metrics
from rlpulse.trainer.model import build_policy
from rlpulse.trainer.policy_trainer import PolicyTrainer
from rlpulse.trainer.rollout import assemble_batch
from tests.trainer.conftest import ENGINE_MODEL, collect

pytestmark = pytest.mark.timeout(600)
MAX_NEW = 8
DIFF = m.ROLLOUT_LOGPROB_DIFF.name


def prompts(n: int, tokenizer: Any, seed: int, prefix: int = 0) -> list[list[int]]:
    """``n`` prompts of random characters (5-20 of them) after a ``prefix``-token shared part."""
    rng = random.Random(seed)
    ids = range(4, len(tokenizer))  # past pad, bos, eos, unk
    shared = [rng.choice(ids) for _ in range(prefix)]
    return [shared + [rng.choice(ids) for _ in range(rng.randint(5, 20))] for _ in range(n)]


def logprob_diff(
    policy: Any, tokenizer: Any, rows: list[list[int]], out: tuple[list, list | None]
) -> dict[str, float]:
    """``rollout/logprob_diff`` as a run reports it: the engine's log-probs of its sampled
    tokens against ``policy``'s rescoring of them (the trainer's old log-probs)."""
    responses, log_probs = out
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    gen = assemble_batch(ids, mask, responses, MAX_NEW, tokenizer, log_probs)
    scored = PolicyTrainer(policy, PPOConfig(), comm=None).log_probs(gen.batch)  # type: ignore[arg-type]
    logged = emit.old_log_probs(
        scored.log_probs, scored.entropy, gen.batch.response_mask, gen.batch.rollout_log_probs
    )
    record = collect([[logged]])
    # The p99 the collector reads off the producer's sketch (collect() merges no sketches).
    diff = logged[DIFF]
    samples = diff.values[diff.mask].double().numpy()
    record[f"{DIFF}/p99"] = float(
        sketch.quantile(sketch.counts_of(samples), 0.99, low=samples.min(), high=samples.max())
    )
    return record


def worst(record: dict[str, float]) -> float:
    """The largest |rollout/logprob_diff| of the step."""
    return max(abs(record[f"{DIFF}/max"]), abs(record[f"{DIFF}/min"]))


def test_engine_metrics_count_what_the_engine_did(vllm_engine: Any, tokenizer: Any) -> None:
    vllm_engine.take_raw()  # whatever earlier tests left
    rows = prompts(32, tokenizer, seed=1)
    tokens, _ = vllm_engine.generate(rows, 1.0, 1.0, greedy=False)
    deltas, samples = vllm_engine.take_raw()
    got = step_metrics(deltas, samples)
    generated = sum(len(t) for t in tokens)
    assert got[E.ENGINE_GENERATION_TOKENS.name] == generated
    assert got[E.ENGINE_PROMPT_TOKENS.name] == sum(len(r) for r in rows)
    assert got[E.ENGINE_REQUESTS.name] == 32
    assert got[E.ENGINE_PREEMPTIONS.name] == 0
    assert got[E.ENGINE_PREFIX_CACHE_QUERIES.name] == sum(len(r) for r in rows)
    assert 0.0 < got[E.ENGINE_KV_CACHE_USAGE.name] <= 1.0
    assert 1 <= got[E.ENGINE_REQUESTS_RUNNING.name] <= 32
    # The recorder saw the very samples vLLM put in its own histograms: same count, same sum.
    for vllm_name, values, count in (
        ("vllm:time_to_first_token_seconds", samples.ttft, 32),
        ("vllm:inter_token_latency_seconds", samples.itl, generated - 32),
        ("vllm:e2e_request_latency_seconds", samples.e2e, 32),
        ("vllm:request_queue_time_seconds", samples.queue, 32),
    ):
        assert len(values) == count == deltas[f"{vllm_name}:count"], vllm_name
        assert sum(values) == pytest.approx(deltas[f"{vllm_name}:sum"], rel=1e-9), vllm_name
    for histogram, count in ((E.ENGINE_TTFT, 32), (E.ENGINE_ITL, generated - 32)):
        assert sum(got.get(b, 0) for b in histogram.bucket_names) == count
    assert min(samples.e2e) >= min(samples.ttft) > 0.0


def test_weight_push_reaches_the_running_engine(vllm_engine: Any, tokenizer: Any) -> None:
    a = build_policy(ENGINE_MODEL, tokenizer, seed=0)
    b = build_policy(ENGINE_MODEL, tokenizer, seed=1)
    rows = prompts(16, tokenizer, seed=2)
    before, _ = vllm_engine.generate(rows, 1.0, 1.0, greedy=True)
    try:
        vllm_engine.load_weights(b.state_dict())
        after, _ = vllm_engine.generate(rows, 1.0, 1.0, greedy=True)
        assert sum(x != y for x, y in zip(before, after, strict=True)) >= 12
        # Sampled with the new weights, scored by HF with the new weights: fp32 noise only.
        out = vllm_engine.generate(rows, 1.0, 1.0, greedy=False)
        assert worst(logprob_diff(b, tokenizer, rows, out)) < 1e-4
    finally:
        vllm_engine.load_weights(a.state_dict())
    again, _ = vllm_engine.generate(rows, 1.0, 1.0, greedy=True)
    assert again == before


def test_logprob_diff_catches_a_prefix_cache_left_stale(vllm_engine: Any, tokenizer: Any) -> None:
    """Prompts sharing a 201-token prefix: the engine caches its KV blocks. Weights pushed
    without resetting the cache leave those blocks computed by the old weights, and the
    engine's log-probs drift from the new policy's; with the reset they match."""
    a = build_policy(ENGINE_MODEL, tokenizer, seed=0)
    b = build_policy(ENGINE_MODEL, tokenizer, seed=1)
    rows = prompts(16, tokenizer, seed=3, prefix=201)
    vllm_engine.generate(rows, 1.0, 1.0, greedy=True)  # the old weights fill the cache
    vllm_engine.take_raw()
    try:
        vllm_engine.load_weights(b.state_dict(), reset_prefix_cache=False)
        stale = logprob_diff(b, tokenizer, rows, vllm_engine.generate(rows, 1.0, 1.0, False))
        hits = vllm_engine.take_metrics()[E.ENGINE_PREFIX_CACHE_HITS.name]
        vllm_engine.load_weights(b.state_dict())  # the trainer's way: reset after the push
        fresh = logprob_diff(b, tokenizer, rows, vllm_engine.generate(rows, 1.0, 1.0, False))
    finally:
        vllm_engine.load_weights(a.state_dict())
    assert hits >= 16 * 128  # every prompt found its first block cached
    print(f"stale cache: {stale[f'{DIFF}/p99']:.3g} p99, {worst(stale):.3g} worst; ", end="")
    print(f"reset: {fresh[f'{DIFF}/p99']:.3g} p99, {worst(fresh):.3g} worst")
    assert worst(fresh) < 1e-4
    assert worst(stale) > 100 * max(worst(fresh), 1e-6)
    assert abs(stale[f"{DIFF}/p99"]) > 1e-3 > abs(fresh[f"{DIFF}/p99"])


def test_a_bfloat16_engine_differs_from_the_float32_trainer(
    tmp_path_factory: pytest.TempPathFactory, vllm_engine: Any, tokenizer: Any
) -> None:
    """A second in-process engine in bfloat16: its log-probs differ from the trainer's float32
    rescoring by far more than the float32 engine's do."""
    from rlpulse.trainer.rollout_vllm import EngineSettings, VLLMEngine

    policy = build_policy(ENGINE_MODEL, tokenizer, seed=0)
    model_dir = tmp_path_factory.mktemp("bf16-policy")
    policy.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    bf16 = VLLMEngine(
        str(model_dir), EngineSettings(max_new_tokens=MAX_NEW, seed=0, dtype="bfloat16")
    )
    rows = prompts(32, tokenizer, seed=4)
    half = logprob_diff(policy, tokenizer, rows, bf16.generate(rows, 1.0, 1.0, False))
    full = logprob_diff(policy, tokenizer, rows, vllm_engine.generate(rows, 1.0, 1.0, False))
    print(f"bf16: {worst(half):.3g} worst, fp32: {worst(full):.3g} worst")
    assert worst(full) < 1e-4
    assert worst(half) > 5e-4 and worst(half) > 100 * worst(full)
