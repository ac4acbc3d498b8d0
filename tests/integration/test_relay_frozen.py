"""A relay frozen (SIGSTOP) past the root's ``liveness_s`` (issue 46, item 2): real processes
on loopback, a root, two relays with their ``state_dir``, two ranks behind each
(:mod:`tests.integration.relay_freeze`).

Before: the root took the silent relay for dead ranks after ``liveness_s``, emitted the
steps waiting for them partial (and the others past ``max_open_steps`` ahead), then refused
everything the relay forwarded once it ran again as late: 312 of 400 steps partial and 312
late entries per rank in the issue's trial. Now the root waits for a silent relay's ranks as
for slow ranks, holds the other relay back once it is a window ahead, and says so on
/metrics: every step complete and exact, nothing late. A relay that never comes back is
presumed dead after ``max(grace_s, liveness_s)`` of silence, and the steps go out partial
naming its ranks, as for dead ranks.
"""

from __future__ import annotations

import pytest

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.tiers.watch import dead_after
from tests.integration.relay_freeze import FROZEN, LAYOUT, RANKS, Outcome, scenario
from tests.integration.workload import expected

BEHIND_FROZEN = [(role, rank) for role, rank in LAYOUT if rank % 2 == FROZEN]
OTHERS = [(role, rank) for role, rank in LAYOUT if rank % 2 != FROZEN]


def check_exact(outcome: Outcome, steps: int) -> None:
    """Every step once, in order, complete and exact (pooled with numpy)."""
    records = outcome.records
    assert [r["step"] for r in records] == list(range(steps))
    partial = outcome.partial
    assert not partial, f"{len(partial)} of {steps} steps partial: {partial[:10]}..."
    for record in records:
        assert record["ranks"] == RANKS
        for name, value in expected(LAYOUT, record["step"]).items():
            assert record["metrics"][name] == pytest.approx(value, rel=1e-12, abs=1e-12), name


def silent_seconds(metrics: dict[str, float]) -> list[float]:
    return [v for k, v in metrics.items() if k.startswith("rlpulse_collector_relay_silent_sec")]


def waiting_steps(metrics: dict[str, float]) -> list[float]:
    return [v for k, v in metrics.items() if k.startswith("rlpulse_collector_relay_waiting_st")]


@pytest.mark.timeout(300)
def test_a_relay_frozen_past_liveness_turns_no_healthy_rank_into_a_dead_one(tmp_path) -> None:
    """A short ``liveness_s`` (2 s) and an 8 s freeze of relay 1, at about 20 steps a second:
    past liveness and, with ``max_open_steps`` at its default (64), past the window too."""
    steps, freeze_s, liveness = 200, 8.0, {"liveness_s": 2}
    outcome = scenario(
        tmp_path,
        steps=steps,
        pace_s=0.04,
        freeze_s=freeze_s,
        root_config=liveness,
        relay_config=liveness,
    )
    print(outcome.figures())
    check_exact(outcome, steps)
    assert [s["dropped_late"] for s in outcome.stats] == [0] * RANKS
    assert [s["dropped_send"] for s in outcome.stats] == [0] * RANKS
    assert [s["unacked"] for s in outcome.stats] == [0] * RANKS
    final = outcome.final_metrics
    assert final["rlpulse_collector_late_entries_total"] == 0
    assert final["rlpulse_collector_partial_steps_total"] == 0
    # While frozen the root said so: one relay silent (not dead), for most of the freeze, the
    # steps waiting for it, the other relay held back at the window.
    frozen = outcome.frozen_metrics
    assert frozen["rlpulse_collector_relays_silent"] == 1
    assert frozen["rlpulse_collector_relays_presumed_dead"] == 0
    assert max(silent_seconds(frozen)) >= freeze_s - 1.5
    assert max(waiting_steps(frozen)) > 0
    assert frozen["rlpulse_collector_held_back_total"] >= 1
    assert final["rlpulse_collector_relays_silent"] == 0
    assert "speaks again after" in outcome.logs["root"]
    # Each hop's acknowledgements: nothing timed out at the relays, nothing went twice.
    assert outcome.figures()["relay_write_failures"] == 0
    assert all(", 0 late," in line and "0 duplicates" in line for line in stop_lines(outcome))


def stop_lines(outcome: Outcome) -> list[str]:
    lines = list(outcome.figures()["stop_lines"].values())
    assert len(lines) == 3 and all(lines), lines
    return lines


@pytest.mark.timeout(300)
def test_a_relay_that_never_comes_back_is_presumed_dead_after_the_stated_bound(tmp_path) -> None:
    """Relay 1 SIGKILLed: its ranks' steps go out partial naming them once it has been
    silent for ``max(grace_s, liveness_s)`` (4 s here), exact over the other ranks, and the
    root's /metrics says the relay is presumed dead, not merely silent."""
    steps, timing = 150, {"liveness_s": 1.5, "grace_s": 4}
    bound = dead_after(CollectorConfig(**timing))
    outcome = scenario(
        tmp_path,
        steps=steps,
        pace_s=0.04,
        freeze_s=bound + 2,
        root_config=timing,
        relay_config=timing,
        kill=True,
    )
    print(outcome.figures())
    records = outcome.records
    assert [r["step"] for r in records] == list(range(steps))
    first = outcome.partial[0]
    assert outcome.partial == list(range(first, steps)), "partial from the kill on"
    missing = sorted(f"{role}/{rank}" for role, rank in BEHIND_FROZEN)
    for record in records[first:]:
        assert sorted(record["missing"]) == missing and record["ranks"] == len(OTHERS)
        for name, value in expected(OTHERS, record["step"]).items():
            assert record["metrics"][name] == pytest.approx(value, rel=1e-12, abs=1e-12), name
    frozen = outcome.frozen_metrics
    assert frozen["rlpulse_collector_relays_presumed_dead"] == 1
    assert frozen["rlpulse_collector_relays_silent"] == 0
    assert max(silent_seconds(frozen)) >= bound
    assert ": presumed dead" in outcome.logs["root"]
    others = [outcome.stats[rank] for _, rank in OTHERS]
    assert [s["dropped_late"] for s in others] == [0] * len(OTHERS)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_issues_trial_a_relay_frozen_for_30s_with_every_default(tmp_path) -> None:
    """The trial of issue 46: 400 steps at 0.1 s, relay 1 frozen for 30 s, every default
    (``liveness_s`` 10 s, ``grace_s`` 60 s, ``max_open_steps`` 64). Before: 312 of 400 steps
    partial, 312 late entries for each rank behind the frozen relay."""
    steps = 400
    outcome = scenario(tmp_path, steps=steps, pace_s=0.1, freeze_s=30.0)
    print(outcome.figures())
    check_exact(outcome, steps)
    assert [s["dropped_late"] for s in outcome.stats] == [0] * RANKS
    assert outcome.final_metrics["rlpulse_collector_late_entries_total"] == 0
    assert outcome.frozen_metrics["rlpulse_collector_relays_silent"] == 1
