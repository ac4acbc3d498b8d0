"""Shared fixtures for the sink tests: steps covering the whole catalog, what the jsonl sink
writes for them (the reference every other sink is compared with), and an environment where
wandb and swanlab stay offline and write only under the test's temporary directory."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rlpulse.collector.sinks.base import SinkContext
from rlpulse.collector.sinks.jsonl import JsonlSink
from rlpulse.schemas.metrics import CATALOG
from rlpulse.schemas.record import StepRecord
from rlpulse.schemas.samples import SampleLimits, SampleState, reduce_rows

# Every reported name of the catalog (templates by their examples, with "x" for free
# parameters, and by names a real run logs) plus one outside the catalog.
NAMES = sorted(
    {
        *CATALOG.output_names(),
        "time/actor_train/train_step/total",
        "memory/actor_train/train_step/end/onload/max_allocated/0",
        "memory/cpu/actor_train/train_step/end/rss",
        "custom/outside_catalog",
    }
)


def make_records(run: str = "r1", steps: int = 3) -> list[StepRecord]:
    """Steps whose values are not float32-exact (0.1 multiples) or are large integers."""
    records = []
    for step in range(steps):
        metrics = {name: round(0.1 * (i + 1) + step, 6) for i, name in enumerate(NAMES)}
        metrics["system/tokens"] = 123_456_789.0 + step  # above 2**24: float32 rounds it
        metrics["system/samples"] = 64.0 * (step + 1)
        roles = {name: "actor_train" for name in NAMES if not CATALOG.resolve(name).derived}
        records.append(
            StepRecord(
                run=run,
                step=step,
                metrics=metrics,
                ranks=2,
                time=1_700_000_000.0 + step,
                roles=roles,
            )
        )
    return records


def make_samples(k: int = 2) -> dict[str, SampleState]:
    """Two names' samples merged over two ranks, with texts a display must escape or cut:
    ``|``, line breaks, a 5000-character response (cut by the producer's byte limit), non-ASCII
    text, a field only some rows have, and a row the producer drops."""
    limits = SampleLimits(k=k, field_bytes=4096)
    rollout = [
        {
            "prompt": f"Q{i}: 2+{i}?",
            "response": f"answer | {2 + i}\nbecause",
            "reward": float(i),
            "advantage": i - 1.5,
            "response_length": 3 + i,
        }
        for i in range(4)
    ]
    rollout[3]["response"] = "x" * 5000  # the best row: cut to field_bytes, marked
    rollout[0]["note"] = "naïve — ünïcode"  # the worst row has one more field
    merged = reduce_rows(rollout[:2], "reward", origin=("actor_train", 0), limits=limits).merge(
        reduce_rows(
            [*rollout[2:], {"reward": "bad"}], "reward", origin=("actor_train", 1), limits=limits
        )
    )
    val = reduce_rows(
        [{"prompt": "p", "response": "r", "score": 1}], "score", origin=("val", 0), limits=limits
    )
    return {"rollout/samples": merged, "val/samples": val}


def samples_record(run: str = "r1", step: int = 0) -> StepRecord:
    """A step whose samples are :func:`make_samples`' and whose metrics count their rows, as
    the collector emits it."""
    samples = make_samples()
    return StepRecord(
        run=run,
        step=step,
        metrics={"time/rollout": 1.5 + step, **{n: float(s.rows) for n, s in samples.items()}},
        ranks=2,
        time=1_700_000_000.0 + step,
        roles={"rollout/samples": "actor_train", "val/samples": "val"},
        samples=samples,
    )


@pytest.fixture
def records() -> list[StepRecord]:
    return make_records()


def jsonl_view(records: list[StepRecord], path: Path) -> dict[tuple[str, int], dict[str, float]]:
    """Write ``records`` with the real jsonl sink and read its lines back."""
    sink = JsonlSink.from_kwargs({"path": str(path)}, SinkContext())
    sink.open()
    for record in records:
        sink.write(record)
    sink.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return {(obj["run"], obj["step"]): obj["metrics"] for obj in lines}


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """No network, no writes outside ``tmp_path``: HOME and the working directory move there,
    and wandb/swanlab are told to stay offline, quiet and free of telemetry."""
    home = tmp_path / "home"
    home.mkdir()
    for key, value in {
        "HOME": str(home),
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_ERROR_REPORTING": "false",
        "WANDB_DISABLE_GIT": "true",
        "WANDB_CONFIG_DIR": str(home / ".config" / "wandb"),
        "WANDB_CACHE_DIR": str(home / ".cache" / "wandb"),
        "WANDB_DATA_DIR": str(home / ".local" / "wandb"),
        "SWANLAB_INTERACTIVE": "false",
        "SWANLAB_ROOT": str(home / ".swanlab"),
    }.items():
        monkeypatch.setenv(key, value)
    for key in ("WANDB_API_KEY", "SWANLAB_API_KEY", "SWANLAB_MODE", "SWANLAB_WEBHOOK"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    yield tmp_path


@pytest.fixture
def rejecting_server() -> Iterator[tuple[str, list[tuple[str, str]]]]:
    """A loopback HTTP server that answers every request 401: an online tracker pointed at it
    fails at once, without any outside address. Yields its URL and the (path, raw request)
    pairs it saw."""
    seen: list[tuple[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append((self.path, f"{self.headers}{body!r}"))
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"errors": [{"message": "bad key"}], "message": "bad key"}')

        do_GET = do_POST

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()
    thread.join()
