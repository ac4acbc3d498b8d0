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
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from rlpulse.producer.vllm_stats import step_metrics
from rlpulse.schemas import engine as E, metrics as m, sketch
from rlpulse.trainer import emit
from rlpulse.trainer.config import PPOConfig
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


def test_engine_metrics_merge_exactly_across_rollout_workers(
    vllm_engine: Any, tokenizer: Any
) -> None:
    """Two rollout workers' steps (two generations of the session engine, one per worker),
    merged by the collector's aggregator: counts add, the KV-cache use is the larger, and the
    latency histograms pool every sample of both (count, mean, max exact)."""
    vllm_engine.take_raw()
    parts = []
    for seed, n in ((5, 24), (6, 40)):
        rows = prompts(n, tokenizer, seed=seed)
        tokens, _ = vllm_engine.generate(rows, 1.0, 1.0, greedy=False)
        deltas, samples = vllm_engine.take_raw()
        parts.append((sum(len(t) for t in tokens), samples, step_metrics(deltas, samples)))
    merged = collect([[logged] for _, _, logged in parts])
    assert merged[E.ENGINE_REQUESTS.name] == 24 + 40
    assert merged[E.ENGINE_GENERATION_TOKENS.name] == sum(g for g, _, _ in parts)
    assert merged[E.ENGINE_KV_CACHE_USAGE.name] == max(s.kv_cache_usage for _, s, _ in parts)
    ttft = [x for _, s, _ in parts for x in s.ttft]
    assert sum(merged.get(b, 0) for b in E.ENGINE_TTFT.bucket_names) == len(ttft) == 64
    assert merged[f"{E.ENGINE_TTFT.name}/mean"] == pytest.approx(sum(ttft) / len(ttft), rel=1e-9)
    assert merged[f"{E.ENGINE_TTFT.name}/max"] == pytest.approx(max(ttft), rel=1e-9)


def test_a_bfloat16_engine_differs_from_the_float32_trainer(
    vllm_engine: Any, vllm_engine_bf16: Any, tokenizer: Any
) -> None:
    """A second in-process engine in bfloat16: its log-probs differ from the trainer's float32
    rescoring by far more than the float32 engine's do."""
    policy = build_policy(ENGINE_MODEL, tokenizer, seed=0)
    rows = prompts(32, tokenizer, seed=4)
    half = logprob_diff(policy, tokenizer, rows, vllm_engine_bf16.generate(rows, 1.0, 1.0, False))
    full = logprob_diff(policy, tokenizer, rows, vllm_engine.generate(rows, 1.0, 1.0, False))
    print(f"bf16: {worst(half):.3g} worst, fp32: {worst(full):.3g} worst")
    assert worst(full) < 1e-4
    assert worst(half) > 5e-4 and worst(half) > 100 * worst(full)


def test_sleep_is_used_where_supported_and_skipped_with_a_note_on_cpu(vllm_engine: Any) -> None:
    if vllm_engine.on_cpu:
        assert not vllm_engine.sleeps
        assert "sleep mode is not supported on CPU" in (vllm_engine.sleep_note or "")
    else:
        assert vllm_engine.sleeps and vllm_engine.sleep_note is None
    vllm_engine.sleep()  # onload/offload around a phase: a no-op where skipped
    vllm_engine.wake_up()
    tokens, _ = vllm_engine.generate([[5, 6, 7]], 1.0, 1.0, greedy=True)
    assert len(tokens[0]) >= 1


def test_an_unsupported_head_size_is_refused_naming_the_fix(
    tmp_path_factory: pytest.TempPathFactory, vllm_engine: Any, tokenizer: Any
) -> None:
    from rlpulse.schemas.errors import ConfigError
    from rlpulse.trainer.config import load_config
    from rlpulse.trainer.rollout_vllm import EngineError, EngineSettings, VLLMEngine
    from rlpulse.trainer.workers.rollout import choose_backend

    model_dir = tmp_path_factory.mktemp("head16")
    build_policy(ENGINE_MODEL.__class__(num_heads=4), tokenizer, seed=0).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    with pytest.raises(EngineError, match=r"head size 16 .* set model\.num_heads"):
        VLLMEngine(str(model_dir), EngineSettings(max_new_tokens=4, seed=0))
    # Before any worker starts: vllm refuses naming the field, auto falls back to HF and
    # says why; on CUDA vLLM runs head size 16, and nothing is refused.
    heads4 = load_config(None, ["model.num_heads=4", "rollout.backend=vllm"])
    with pytest.raises(ConfigError) as refused:
        choose_backend(heads4, on_cpu=True)
    assert refused.value.field == "model.num_heads"
    assert choose_backend(heads4, on_cpu=False)[0] == "vllm"
    auto = load_config(None, ["model.num_heads=4", "rollout.backend=auto"])
    backend, why = choose_backend(auto, on_cpu=True)
    assert backend == "hf" and "vLLM cannot run this model: model.num_heads: head size 16" in why
    heads2 = load_config(None, ["model.num_heads=2", "rollout.backend=auto"])
    assert choose_backend(heads2, on_cpu=True)[0] == "vllm"


INTEGRATIONS_PYTHON = Path(__file__).resolve().parents[2] / ".venv-integrations" / "bin" / "python"


@pytest.mark.skipif(
    not INTEGRATIONS_PYTHON.exists(), reason="needs .venv-integrations (make install-integrations)"
)
def test_without_vllm_installed_the_choice_says_so() -> None:
    """In .venv-integrations, an environment without vLLM: backend vllm fails naming the
    fix, auto falls back to HF saying why."""
    script = (
        "from rlpulse.trainer.config import load_config\n"
        "from rlpulse.schemas.errors import ConfigError\n"
        "from rlpulse.trainer.workers.rollout import choose_backend\n"
        "cfg = lambda b: load_config(None, ['model.num_heads=2', f'rollout.backend={b}'])\n"
        "print(choose_backend(cfg('auto'), on_cpu=True))\n"
        "try:\n    choose_backend(cfg('vllm'), on_cpu=True)\n"
        "except ConfigError as exc:\n    print('refused:', exc)\n"
    )
    proc = subprocess.run(
        [str(INTEGRATIONS_PYTHON), "-c", script], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "('hf', 'vLLM is not installed (make install adds it)" in proc.stdout
    assert "refused: rollout.backend: vLLM is not installed: run `make install`" in proc.stdout


KV_CACHE_SCRIPT = """
import random, sys, tempfile
from rlpulse.schemas import engine as E
from rlpulse.trainer.config import ModelConfig
from rlpulse.trainer.model import build_policy
from rlpulse.trainer.rollout_vllm import EngineError, EngineSettings, VLLMEngine
from rlpulse.trainer.tokenizer import build_tokenizer

def policy(positions):
    tok, d = build_tokenizer(), tempfile.mkdtemp()
    cfg = ModelConfig(hidden_size=64, intermediate_size=128, num_heads=2,
                      max_position_embeddings=positions)
    build_policy(cfg, tok, seed=0).save_pretrained(d)
    tok.save_pretrained(d)
    return d

if __name__ == "__main__":
    try:  # 1 MiB holds about 900 tokens of this model: not one sequence of 8192
        VLLMEngine(policy(8192), EngineSettings(max_new_tokens=8, seed=0, kv_cache_mb=1))
    except EngineError as exc:
        print("refused:", exc)
    engine = VLLMEngine(policy(512), EngineSettings(max_new_tokens=64, seed=0, kv_cache_mb=1))
    rng = random.Random(0)
    engine.generate([[rng.randrange(4, 40) for _ in range(100)] for _ in range(16)], 1.0, 1.0, False)
    got = engine.take_metrics()
    print("preemptions", got[E.ENGINE_PREEMPTIONS.name])
    print("kv_cache_usage", got[E.ENGINE_KV_CACHE_USAGE.name])
"""


@pytest.mark.slow  # 25-50 s (two engine starts in a process of its own): make test-slow
def test_a_kv_cache_too_small_is_refused_or_shows_as_preemptions(tmp_path: Path) -> None:
    """Too small for one sequence: the engine refuses to start, naming rollout.kv_cache_mb.
    Too small for the batch: vLLM preempts (and recomputes), and the step's metrics say so.
    In a process of its own: an engine that fails to start tears down vLLM's process-global
    state, which the session's engines share."""
    script = tmp_path / "kv.py"
    script.write_text(KV_CACHE_SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=400
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "refused: vLLM's KV cache is too small for one sequence of 8192 tokens: raise " in out
    assert "rollout.kv_cache_mb (now 1)" in out
    preempted = int(out.split("preemptions ")[1].split()[0])
    assert preempted > 0
    assert float(out.split("kv_cache_usage ")[1].split()[0]) == 1.0
