"""The samples cost benchmark runs in a tiny setting, writes its JSON and renders its section."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import report, samples_cost


def test_samples_cost_runs_and_renders(tmp_path: Path) -> None:
    samples_cost.main(
        ["--rounds", "1", "--rows", "16", "--text-bytes", "64", "--results", str(tmp_path)]
    )
    res = json.loads((tmp_path / "samples_cost.json").read_text())
    by = {r["workload"]: r for r in res["results"]}
    assert sorted(by) == ["samples", "scalar", "scalars60"]
    for r in by.values():
        assert r["us"]["n"] == samples_cost.BLOCK
        assert 0 < r["us"]["median"] <= r["us"]["p99"]
    assert res["sender"]["reduce_us"]["n"] >= 20
    stats = res["producer_stats"]
    assert stats["logged"] == 3 * (10 + samples_cost.BLOCK)  # warm-up and one block each
    if stats["invalid"] == 0:  # a producer that takes Samples: every samples step is recorded
        assert res["samples_in_records"] == 10 + samples_cost.BLOCK

    goals: list = []
    lines = report.section_samples(res, goals)
    assert lines[0].startswith("## 13. Samples")
    rows = [line for line in lines if line.startswith("| ") and "---" not in line]
    assert [r.split(" | ")[0] for r in rows[1:]] == [
        "| one scalar",
        "| 60 scalars",
        "| Samples: 16 rows x 64 B text",
    ]
    ((goal, _, verdict),) = goals
    assert goal == report.SAMPLES_GOAL
    assert (verdict is None) == (res["samples_in_records"] == 0)


def test_section_says_when_not_measured() -> None:
    goals: list = []
    assert "Not measured" in "\n".join(report.section_samples(None, goals))
    assert goals == [(report.SAMPLES_GOAL, "not run", None)]
