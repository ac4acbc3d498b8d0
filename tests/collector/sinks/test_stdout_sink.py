"""The stdout sink: a block per step, and one line per samples name with its best and worst."""

from __future__ import annotations

import io

import pytest

from rlpulse.collector.sinks import samples_view
from rlpulse.collector.sinks.stdout import StdoutSink
from rlpulse.schemas.record import StepRecord
from tests.collector.sinks.conftest import samples_record


def _printed(record: StepRecord) -> list[str]:
    out = io.StringIO()
    sink = StdoutSink(stream=out)
    sink.open()
    sink.write(record)
    sink.close()
    return out.getvalue().splitlines()


def test_a_step_without_samples_prints_no_samples_line() -> None:
    lines = _printed(StepRecord(run="r", step=3, metrics={"actor/pg_loss": 0.5}, ranks=2))
    assert lines == ["step 3  run r  2 ranks", "  actor  pg_loss=0.5"]


def test_each_samples_name_gets_one_line_with_best_and_worst() -> None:
    record = samples_record(step=4)
    lines = _printed(record)
    assert lines[0] == "step 4  run r1  2 ranks"
    assert "  rollout  samples=4" in lines  # the count, with the numbers
    sample_lines = [line for line in lines if line.startswith("  samples ")]
    assert sample_lines == [
        "  samples " + samples_view.one_line(n, s) for n, s in record.samples.items()
    ]
    rollout, val = sample_lines
    assert "best reward=3 actor_train/1" in rollout and "worst reward=0 actor_train/0" in rollout
    assert len(rollout) < 250  # the 4096-byte best response is cut for the line
    assert 'best score=1 val/0 "r"' in val


def test_a_samples_line_that_fails_leaves_the_numbers_printed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(name: str, state: object, limit: int = 0) -> str:
        raise KeyError(name)

    monkeypatch.setattr(samples_view, "one_line", broken)
    out = io.StringIO()
    sink = StdoutSink(stream=out)
    sink.write(samples_record())
    assert sink.samples_failed == 2
    assert out.getvalue().splitlines() == [
        "step 0  run r1  2 ranks",
        "  rollout  samples=4",
        "  time     rollout=1.5",
        "  val      samples=1",
    ]


def test_a_partial_step_says_why_missing_ranks_or_a_continued_record() -> None:
    """The head line of a partial step names its missing ranks, and for a record a collector
    restarted without ``state_dir`` wrote of a step its earlier instance may have written,
    says so, with the ranks whose calls may be in both (``StepRecord.why_partial``)."""
    sink = StdoutSink()
    missing = StepRecord(run="r", step=3, metrics={}, partial=True, missing=("a/1",))
    assert sink.format(missing).splitlines()[0].endswith("PARTIAL (missing a/1)")
    again = StepRecord(run="r", step=3, metrics={}, partial=True, continued=True, resent=("a/0",))
    assert (
        sink.format(again)
        .splitlines()[0]
        .endswith(
            "PARTIAL (continued: an earlier collector instance may have written part of it; "
            "calls of a/0 may be counted there too)"
        )
    )
