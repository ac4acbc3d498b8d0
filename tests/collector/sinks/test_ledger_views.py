"""The step ledger where users read it: the stdout line (instead of the ledger's numbers), the
trace's critical-path row and step arguments, and the timeline reader that ignores that row."""

from __future__ import annotations

import io
import json
from pathlib import Path

import msgspec
import pytest

from rlpulse.collector.sinks.stdout import StdoutSink
from rlpulse.collector.sinks.trace import PATH_TID, STEPS_PID, TraceSink, trace_path
from rlpulse.runtools.timeline import load_trace
from rlpulse.schemas import attribution as A, ledger as L
from rlpulse.schemas.record import StepRecord
from rlpulse.schemas.spans import Span


def spans(step: int, reward: float = 0.1) -> list[Span]:
    t = 100.0 + 10 * step
    return [
        Span("rollout", 0, "h", "rollout", "generate", t, t + 2.0, 2.0, None, None, None, 60),
        Span("reward", 0, "h", "reward", "compute_rewards", t + 2.1, t + 2.1 + reward, reward),
        Span(
            "actor_train",
            0,
            "h",
            "actor_train",
            "train_step",
            t + 2.3 + reward,
            t + 3.3 + reward,
            1.0,
        ),
        Span(
            "actor_train",
            1,
            "h",
            "actor_train",
            "train_step",
            t + 2.3 + reward,
            t + 3.8 + reward,
            1.5,
        ),
    ]


def records(n: int = 6, slow: int = 5) -> list[StepRecord]:
    window, out = A.RollingSteps(), []
    for step in range(n):
        ledger = L.compute(spans(step, reward=1.5 if step == slow else 0.1), finish_p90=1.5)
        assert ledger is not None
        metrics = ledger.metrics()
        numbers, cause = window.judge(metrics, ledger.record, A.DEFAULT_MARGIN)
        metrics.update(numbers)
        record = msgspec.structs.replace(ledger.record, cause=cause)
        reward = 1.5 if step == slow else 0.1
        out.append(
            StepRecord(
                run="demo",
                step=step,
                metrics={"x": 1.0, **metrics},
                spans=tuple(spans(step, reward)),
                ledger=record,
            )
        )
    return out


def test_stdout_prints_the_ledger_in_one_line_instead_of_its_numbers() -> None:
    out = io.StringIO()
    sink = StdoutSink(stream=out)
    sink.open()
    sink.write(records()[5])
    text = out.getvalue()
    lines = text.splitlines()
    assert lines[1] == (
        "  step 5 5.30 s = rollout 2.00 (tail 0.50, rollout/0: 60 tokens) + reward 1.50 + "
        "actor_train 1.50 (straggler 0.50, actor_train/1) + gaps 0.30 | overlap 0.00 | slow: "
        "+1.4 s over the median 3.9 s: reward reward/0 reward/compute_rewards"
    )
    assert "ledger/" not in text and "x=1" in text


def test_the_trace_marks_the_critical_path_and_the_timeline_still_reads_steps(
    tmp_path: Path,
) -> None:
    sink = TraceSink(tmp_path)
    sink.open()
    for r in records():
        sink.write(r)
    sink.close()
    evs = json.loads(trace_path(tmp_path, "demo").read_text())
    path = [e for e in evs if e.get("ph") == "X" and e["pid"] == STEPS_PID and e["tid"] == PATH_TID]
    step5 = [e for e in path if e["args"]["step"] == 5]
    assert [(e["name"], e["args"].get("rank")) for e in step5] == [
        ("rollout/generate", "rollout/0"),
        ("gap", None),
        ("reward/compute_rewards", "reward/0"),
        ("gap", None),
        ("actor_train/train_step", "actor_train/1"),
    ]
    assert step5[0]["ts"] == pytest.approx(150.0 * 1e6)
    assert sum(e["dur"] for e in step5) == pytest.approx(5.3e6)
    step = next(e for e in evs if e.get("name") == "step 5")
    assert step["args"]["cause"] == "reward reward/0 reward/compute_rewards"
    assert step["args"]["ledger"].startswith("step 5 5.30 s = ")
    trace = load_trace(trace_path(tmp_path, "demo"))
    assert sorted(trace.steps) == list(range(6)) and len(trace.bars) == 6 * 4
    assert trace.steps[5] == pytest.approx((150.0, 155.3))
