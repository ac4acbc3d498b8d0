"""Rollout time per training step, HF ``generate`` against vLLM (CPU build, in process), and
rlpulse's overhead on a vLLM step.

One step of the demo's rollout (``trainer/configs/demo.yaml``: 64 prompts x 4 samples of the
reverse task, 6 new tokens, temperature 1, the demo's tiny Llama with 2 heads of 32), one
torch thread as the rollout worker has:

* ``hf``: :func:`rlpulse.trainer.rollout.generate_hf`;
* ``vllm``: the weight push the worker does every step (``reload_weights`` and the
  prefix-cache reset) and ``VLLMEngine.generate``;
* rlpulse's overhead on a vLLM step: the same step with the engine-metrics recorder attached,
  ``take_metrics()`` and ``Producer.log()`` to a live collector, against the step without them
  (recorder detached, nothing read or logged), alternated so load drifts hit both alike;
  and, since that difference drowns in this machine's noise, rlpulse's own work timed where
  it runs: the recorder's ``record()`` calls inside the engine's iterations, and
  ``take_metrics()`` plus ``log()`` after the generation.

A second shape, 64 new tokens, shows where vLLM's per-iteration scheduling stops dominating.

    .venv/bin/python -m benchmarks.vllm_rollout [--reps 15]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import summarize, write_json
from rlpulse.collector.launch import start_collector
from rlpulse.producer import Producer
from rlpulse.producer.vllm_stats import StepRecorder
from rlpulse.trainer.config import ModelConfig, TaskConfig
from rlpulse.trainer.model import build_policy
from rlpulse.trainer.rollout import encode_prompts, generate_hf
from rlpulse.trainer.rollout_vllm import EngineSettings, VLLMEngine
from rlpulse.trainer.task import build_task
from rlpulse.trainer.tokenizer import build_tokenizer

MODEL = ModelConfig(hidden_size=64, intermediate_size=192, num_layers=2, num_heads=2)
MAX_NEW, PROMPTS, GROUP = 6, 64, 4
LONG = 64


class TimedRecorder(StepRecorder):
    """The engine-metrics recorder, timing its own ``record()`` calls."""

    def __init__(self) -> None:
        super().__init__()
        self.spent = 0.0

    def record(self, *args: Any, **kwargs: Any) -> None:
        t0 = time.perf_counter()
        super().record(*args, **kwargs)
        self.spent += time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # the rollout worker's setting (cluster.torch_threads)
    tok = build_tokenizer()
    policy = build_policy(MODEL, tok, seed=0).eval()
    task = build_task(TaskConfig(), seed=0)
    prompts = [p.prompt for p in task.sample(PROMPTS) for _ in range(GROUP)]
    ids, mask = encode_prompts(tok, prompts)
    rows = [row[m.bool()].tolist() for row, m in zip(ids, mask, strict=True)]

    hf: dict[int, list[float]] = {MAX_NEW: [], LONG: []}
    for _ in range(args.reps):
        for new, times in hf.items():
            t0 = time.perf_counter()
            generate_hf(
                policy, tok, prompts, max_new_tokens=new, temperature=1.0, top_p=1.0, greedy=False
            )
            times.append(time.perf_counter() - t0)

    model_dir = Path(tempfile.mkdtemp(prefix="rlpulse-bench-vllm-"))
    policy.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    t0 = time.perf_counter()
    engine = VLLMEngine(str(model_dir), EngineSettings(max_new_tokens=MAX_NEW, seed=0))
    start_s = time.perf_counter() - t0
    weights = policy.state_dict()
    engine.generate(rows, 1.0, 1.0, False)  # warm-up
    manager = engine.llm.llm_engine.logger_manager
    timed = TimedRecorder()
    if manager is not None:
        manager.stat_loggers.remove(engine.stats.recorder)
    engine.stats.recorder = timed

    with tempfile.TemporaryDirectory() as tmp:
        collector = start_collector(
            {"track_with": ["jsonl"], "tracker_kwargs": {"jsonl": {"path": f"{tmp}/m.jsonl"}}}
        )
        producer = Producer(collector.address, run="bench", role="rollout")
        push: list[float] = []
        gen: list[float] = []
        bare: list[float] = []
        logged: list[float] = []
        recorder: list[float] = []
        read_and_log: list[float] = []
        for step in range(args.reps):
            t0 = time.perf_counter()
            engine.load_weights(weights)
            push.append(time.perf_counter() - t0)
            for with_rlpulse in (step % 2 == 0, step % 2 == 1):
                _attach(manager, timed, with_rlpulse)
                timed.spent = 0.0
                t0 = time.perf_counter()
                engine.generate(rows, 1.0, 1.0, False)
                gen_s = time.perf_counter() - t0
                if with_rlpulse:
                    t1 = time.perf_counter()
                    producer.log(engine.take_metrics(), step)
                    read_and_log.append(time.perf_counter() - t1)
                    logged.append(time.perf_counter() - t0)
                    recorder.append(timed.spent)
                    gen.append(gen_s)
                else:
                    bare.append(gen_s)
        producer.close()
        collector.stop()
    long_engine = EngineSettings(max_new_tokens=LONG, seed=0)
    engine.settings = long_engine  # the same engine, 64 new tokens per response
    vllm_long: list[float] = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        engine.generate(rows, 1.0, 1.0, False)
        vllm_long.append(time.perf_counter() - t0)

    with_med = summarize(logged)["median"]
    without_med = summarize(bare)["median"]
    own = [r + w for r, w in zip(recorder, read_and_log, strict=True)]
    results: dict[str, Any] = {
        "step": {"prompts": PROMPTS * GROUP, "max_new_tokens": MAX_NEW, "model": vars(MODEL)},
        "hf_generate_s": summarize(hf[MAX_NEW]),
        "hf_generate_64_tokens_s": summarize(hf[LONG]),
        "vllm_engine_start_s": start_s,
        "vllm_weight_push_s": summarize(push),
        "vllm_generate_s": summarize(gen),
        "vllm_generate_64_tokens_s": summarize(vllm_long),
        "vllm_rollout_step_s": summarize([p + g for p, g in zip(push, gen, strict=True)]),
        "vllm_step_without_rlpulse_s": summarize(bare),
        "vllm_step_with_rlpulse_s": summarize(logged),
        "ab_difference_s": with_med - without_med,
        "rlpulse_recorder_s": summarize(recorder),
        "rlpulse_take_metrics_and_log_s": summarize(read_and_log),
        "rlpulse_own_work_s": summarize(own),
        "rlpulse_own_work_frac_of_step": summarize(own)["median"] / without_med,
        "load_average_1min": os.getloadavg()[0],
    }
    path = write_json("vllm_rollout", results)
    for key, value in results.items():
        print(f"{key}: {value}")
    print(f"written to {path}")
    return 0


def _attach(manager: Any, recorder: Any, on: bool) -> None:
    """Add or remove rlpulse's stat logger from the engine's."""
    if manager is None:
        return
    if on and recorder not in manager.stat_loggers:
        manager.stat_loggers.append(recorder)
    if not on and recorder in manager.stat_loggers:
        manager.stat_loggers.remove(recorder)


if __name__ == "__main__":
    raise SystemExit(main())
