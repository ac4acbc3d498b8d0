"""Issue 46, item 1, through real producer processes and a real collector on loopback: a
sender that falls behind reducing ``Samples`` rows holds them within its byte bound, drops
and counts the rest, and every step reaches the collector: the ones that lost rows partial,
naming the rank, counted on the producer (``stats()``, a warning naming the steps) and on
the collector (its stop report). Before, the sender was abandoned at ``close()`` still
reducing, and the steps it had not sent never reached the collector, with no count
anywhere. The scenario itself is ``tests.integration.behind``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlpulse.producer.config import MIB
from tests.integration.behind import Scenario, run, summary


def check(result: dict[str, Any]) -> None:
    """What must hold whatever the machine's speed: every step out, each partial exactly
    where a rank lost rows and naming it, the scalars of every rank in every step, and the
    same count everywhere the user looks."""
    s = Scenario(**result["scenario"])
    assert result["steps"] == list(range(s.steps)), summary(result)
    lost: dict[int, list[str]] = {}
    for rank, report in enumerate(result["ranks"]):
        assert "abandoned" not in " ".join(report["warnings"])
        stats = report["stats"]
        assert stats["logged"] == s.steps and stats["dropped_send"] == 0
        for step in range(s.steps):
            if f"actor_train/{rank}" in result["partial"].get(step, ()):
                lost.setdefault(step, []).append(f"actor_train/{rank}")
        mine = sum(f"actor_train/{rank}" in v for v in lost.values())
        assert stats["dropped_unreduced"] == mine
        if mine:
            assert any("steps went to the collector without" in w for w in report["warnings"])
    assert result["partial"] == lost
    total = sum(len(v) for v in lost.values())
    assert result["collector_producers_dropped"] == total
    assert result["stop_report"]["incomplete_steps"] == total
    assert result["stop_report"]["producers_dropped"] == total
    mean = sum(range(s.ranks)) / s.ranks
    assert result["scalar_ranks"] == {step: step + mean for step in range(s.steps)}


def test_a_sender_behind_on_rows_keeps_them_bounded_and_every_step_reaches_the_collector(
    tmp_path: Path,
) -> None:
    """The issue's scenario scaled down: 2 ranks log 60 steps of 4,000 rows (1 KB texts,
    cut to 64 bytes on the sender: its slow part) with no pause and a 32 MiB bound (about
    three values). Each producer's memory stays near its bound: unbounded, the rows of the
    60 values (about 540 MB) waited for a sender that reduces one in about 40 ms."""
    s = Scenario(
        rows=4000,
        prompt_bytes=1024,
        response_bytes=1024,
        steps=60,
        pace_s=0.0,
        config={"samples_field_bytes": 64, "pending_limit_bytes": 32 * MIB},
    )
    result = run(s, tmp_path)
    check(result)
    assert result["partial"], "the senders fell behind: some rows were dropped"
    assert result["with_samples"], "and some were reduced"
    for report in result["ranks"]:
        assert report["peak_rss_bytes"] < 256 * MIB  # Python, numpy, zmq: about 90 MB


@pytest.mark.slow
def test_the_issue_s_scenario_at_full_size(tmp_path: Path) -> None:
    """2 ranks, 20,000 rows of a 2 KB prompt and a 6 KB response, 40 steps 50 ms apart,
    defaults everywhere. Before: steps 25-39 (35-39 on a faster machine) never reached the
    collector, nothing counted, 1.6-2.15 GB peak RSS per producer."""
    result = run(Scenario(), tmp_path)
    check(result)
    for report in result["ranks"]:
        assert report["peak_rss_bytes"] < 1024 * MIB
