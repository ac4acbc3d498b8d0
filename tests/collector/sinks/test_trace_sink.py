"""The ``trace`` sink: a Chrome/Perfetto trace-event file per run, valid JSON once closed,
continued (not restarted) by a collector that comes back, and drawn by the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlpulse.collector.sinks.trace import TraceSink, trace_path
from rlpulse.runtools.cli import main as run_tools
from rlpulse.runtools.timeline import load_trace
from rlpulse.schemas.record import StepRecord
from rlpulse.schemas.spans import Span


def record(step: int, run: str = "demo/1") -> StepRecord:
    spans = tuple(
        Span(
            role,
            rank,
            f"node{rank}",
            role,
            phase,
            100.0 + step * 10 + rank,
            101.5 + step * 10 + 2 * rank,
            1.0,
            0.5,
        )
        for role, phase in (("actor_train", "train_step"), ("actor_infer", "generate"))
        for rank in range(2)
    )
    return StepRecord(run=run, step=step, metrics={"x": 1.0}, spans=spans)


def events(path: Path) -> list[dict]:
    return json.loads(path.read_text())


def test_a_closed_trace_is_a_json_array_of_trace_events(tmp_path: Path) -> None:
    sink = TraceSink(tmp_path)
    sink.open()
    for step in range(3):
        sink.write(record(step))
    sink.close()
    path = trace_path(tmp_path, "demo/1")
    assert path.name == "demo_1.trace.json"
    evs = events(path)
    complete = [e for e in evs if e.get("ph") == "X"]
    assert len(complete) == 3 * (1 + 4), "a step event and four phase spans per step"
    names = {(e["pid"], e["args"]["name"]) for e in evs if e.get("name") == "process_name"}
    assert {n for _, n in names} == {"steps", "actor_train", "actor_infer"}
    span = next(
        e for e in complete if e["name"] == "generate" and e["tid"] == 1 and e["args"]["step"] == 2
    )
    assert span["ts"] == pytest.approx((100.0 + 20 + 1) * 1e6)
    assert span["dur"] == pytest.approx((101.5 + 20 + 2 - 121.0) * 1e6)
    assert span["args"] == {
        "step": 2,
        "phase": "actor_infer/generate",
        "execute_s": 1.0,
        "gpu_s": 0.5,
    }


def test_a_restarted_collector_continues_the_file(tmp_path: Path) -> None:
    first = TraceSink(tmp_path)
    first.open()
    first.write(record(0))
    first.close()
    second = TraceSink(tmp_path)
    second.open()
    assert second.written_through() == {"demo/1": 0}
    second.write(record(1))
    second.close()
    steps = [
        e["args"]["step"]
        for e in events(trace_path(tmp_path, "demo/1"))
        if e.get("name", "").startswith("step ")
    ]
    assert steps == [0, 1]


def test_an_open_trace_loads_and_the_report_draws_its_timeline(tmp_path: Path) -> None:
    sink = TraceSink(tmp_path / "traces")
    sink.open()
    for step in range(4):
        sink.write(record(step, run="demo"))
    # not closed: a live run's file
    trace = load_trace(trace_path(tmp_path / "traces", "demo"))
    assert trace.run == "demo" and len(trace.bars) == 16 and sorted(trace.steps) == [0, 1, 2, 3]
    jsonl = tmp_path / "metrics.jsonl"
    jsonl.write_text("".join(json.dumps(record(s, run="demo").to_json()) + "\n" for s in range(4)))
    out = tmp_path / "t.png"
    assert run_tools(["report", str(jsonl), "--timeline", "1:3", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert run_tools(["report", str(jsonl), "--timeline", "9"]) == 2, (
        "steps with no spans: an error"
    )
