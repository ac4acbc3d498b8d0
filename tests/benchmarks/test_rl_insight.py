"""benchmarks/rl_insight.py: skips cleanly without RL-Insight, renders its section, runs end to end."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import rl_insight as bench
from benchmarks.report import section_optional

ROOT = Path(__file__).resolve().parents[2]


def test_writes_skipped_when_rl_insight_is_missing(tmp_path, monkeypatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "rl_insight" else real(name)
    )
    monkeypatch.setattr(sys, "argv", ["rl_insight", "--out-dir", str(tmp_path)])
    bench.main()
    data = json.loads((tmp_path / "rl_insight.json").read_text())
    assert "rl_insight" in data["skipped"] and "bench" in data["skipped"]
    goals: list = []
    lines = section_optional("## 10. Against RL-Insight", data, goals, "goal")
    assert lines[2].startswith("**Not measured yet**") and goals[0][2] is None


def _row(name: str, truth: float, per_rank: list[float], theirs: float) -> dict:
    return {
        "name": name,
        "truth": truth,
        "per_rank": per_rank,
        "rlpulse": truth,
        "rl_insight": [theirs],
        "rl_insight_by_rank": per_rank,
    }


def _caller(median: float) -> dict:
    stats = {"median": median, "p99": 2 * median, "max": 3 * median}
    return {
        "us": stats,
        "drain_ms": {"median": 1.0},
        "caller_cpu_us_per_step": median,
        "receiver_cpu_us_per_step": median,
        "delivered": "all",
    }


def test_summary_names_the_surviving_rank_and_judges_the_goal() -> None:
    rows = [
        _row("critic/score/mean", 0.3, [0.9, 0.28], 0.28),
        _row("critic/score/max", 1.0, [1.0, 1.0], 1.0),
        _row("tokens/response_length/max", 1300.0, [1300.0, 569.0], 569.0),
    ]
    res = {
        "caller": {"rlpulse": _caller(30.0), "rl_insight": _caller(9000.0), "null": _caller(1.0)},
        "two_ranks": {"rows": rows, "record_ranks": 2, "partial": False},
        "setup_s": dict.fromkeys(
            ("ray_init_s", "rl_insight_server_s", "rl_insight_init_s", "rlpulse_collector_s"), 1.0
        ),
        "rounds": 1,
        "versions": {"rl-insight": "0.3.0"},
        "load_start": {"load1": 1.0},
        "load_end": {"load1": 1.0},
    }
    out = bench.summary(res)
    text = "\n".join(out["markdown"])
    assert out["met"] is True
    assert "300.0x" in text and "rank 1's for 2," in text
    assert "(both ranks' value)" in text and "on 1/3" in out["measured"]
    res["two_ranks"]["rows"][0]["rlpulse"] = 0.31  # not exact: the goal fails
    assert bench.summary(res)["met"] is False


@pytest.mark.slow
@pytest.mark.skipif(bench.skip_reason() is not None, reason=str(bench.skip_reason()))
def test_runs_end_to_end(tmp_path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.rl_insight",
        "--rounds",
        "1",
        "--out-dir",
        str(tmp_path),
    ]
    subprocess.run(cmd, cwd=ROOT, check=True, timeout=240, capture_output=True)
    data = json.loads((tmp_path / "rl_insight.json").read_text())
    assert data["two_ranks"]["record_ranks"] == 2
    assert all(
        r["rlpulse"] == pytest.approx(r["truth"], rel=1e-9) for r in data["two_ranks"]["rows"]
    )
    assert data["caller"]["rl_insight"]["delivered"].startswith(
        f"{data['caller']['rl_insight']['steps'] * bench.N_SCALARS:,} of"
    )
