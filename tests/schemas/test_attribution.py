"""Why a step was slow (rlpulse.schemas.attribution): a cause only past the margin, only when
one item explains 80% of the excess, named with the rank behind it; otherwise mixed."""

from __future__ import annotations

import pytest

from rlpulse.schemas import attribution as A, ledger as L
from rlpulse.schemas.spans import Span


def step_metrics(spans: list[Span], p90: float | None = None) -> tuple[dict, L.StepLedger]:
    ledger = L.compute(spans, p90)
    assert ledger is not None
    return ledger.metrics(), ledger.record


def demo_step(
    t0: float, slow_rank: float = 0.0, reward: float = 0.1, sync: float = 0.2, tail: float = 0.0
) -> list[Span]:
    """A step: sync, generate (its responses done after 1 s of work, then ``tail`` more),
    reward, two actor ranks training (rank 1 ``slow_rank`` s slower)."""
    s = [
        Span("actor_train", 0, "h", "actor_train", "model_update", t0, t0 + sync, sync),
        Span(
            "rollout",
            0,
            "h",
            "rollout",
            "generate",
            t0 + sync,
            t0 + sync + 1.0 + tail,
            1.0 + tail,
            None,
            None,
            None,
            6 if not tail else 60,
        ),
    ]
    t = t0 + sync + 1.0 + tail
    s.append(Span("reward", 0, "h", "reward", "compute_rewards", t, t + reward, reward))
    t += reward
    for rank in (0, 1):
        end = t + 1.0 + (slow_rank if rank == 1 else 0.0)
        s.append(Span("actor_train", rank, "h", "actor_train", "train_step", t, end, end - t))
    return s


def judged(window: A.RollingSteps, spans: list[Span], p90: float | None = 1.0):
    metrics, record = step_metrics(spans, p90)
    return window.judge(metrics, record, A.DEFAULT_MARGIN)


@pytest.mark.parametrize(
    ("fault", "bucket", "who", "phase"),
    [
        ({"slow_rank": 1.0}, L.STRAGGLER, "actor_train/1", "actor_train/train_step"),
        ({"reward": 1.1}, L.REWARD, "reward/0", "reward/compute_rewards"),
        ({"sync": 1.2}, L.SYNC, "actor_train/0", "actor_train/model_update"),
        ({"tail": 1.5}, L.TAIL, "rollout/0", "rollout/generate"),
    ],
)
def test_one_fault_is_the_cause_of_its_step_only(fault, bucket, who, phase) -> None:
    window = A.RollingSteps()
    causes = []
    for i in range(8):
        spans = demo_step(10.0 * i, **(fault if i == 5 else {}))
        numbers, cause = judged(window, spans)
        causes.append(cause)
        if i == 0:
            assert numbers == {}
        else:
            assert numbers[A.LEDGER_MEDIAN.name] == pytest.approx(2.3)
    assert [i for i, c in enumerate(causes) if c is not None] == [5]
    cause = causes[5]
    assert cause is not None
    assert (cause.bucket, f"{cause.role}/{cause.rank}", cause.phase) == (bucket, who, phase)
    assert cause.share >= A.EXPLAINS


def test_within_the_margin_no_cause() -> None:
    window = A.RollingSteps()
    for i in range(5):
        judged(window, demo_step(10.0 * i))
    numbers, cause = judged(window, demo_step(100.0, reward=0.5))  # 0.4 s on 2.3: 17%
    assert cause is None and numbers[A.LEDGER_EXCESS.name] == pytest.approx(0.4)


def test_no_one_item_explains_it_mixed_with_the_top_three() -> None:
    window = A.RollingSteps()
    for i in range(5):
        judged(window, demo_step(10.0 * i))
    _, cause = judged(window, demo_step(100.0, slow_rank=0.6, reward=0.6, sync=0.6))
    assert cause is not None and cause.bucket == "mixed"
    assert {c.bucket for c in cause.top} == {L.STRAGGLER, L.REWARD, L.SYNC}
    assert cause.label().startswith("mixed: ")


def test_the_window_rolls_and_survives_a_snapshot() -> None:
    window = A.RollingSteps(window=4)
    for i in range(6):
        judged(window, demo_step(10.0 * i, reward=0.1 + i))
    assert len(window.steps) == 4
    again = A.RollingSteps(window=4)
    again.restore(window.snapshot())
    assert list(again.steps) == list(window.steps)
    assert again.kinds == window.kinds
    read_back = A.RollingSteps(window=4)
    for i in range(6):
        metrics, record = step_metrics(demo_step(10.0 * i, reward=0.1 + i), 1.0)
        read_back.add(metrics, record.runs)
    assert list(read_back.steps) == list(window.steps), "rebuilt from records' metrics alike"
    assert read_back.kinds == window.kinds
    older = A.RollingSteps(window=4)  # a checkpoint from before kinds: a bare list of steps
    older.restore(window.snapshot()["steps"])
    assert list(older.steps) == list(window.steps) and not older.kinds


def with_validation(t0: float, validation: float = 0.8, **fault: float) -> list[Span]:
    """``demo_step`` after a validation: the generation run once more, greedy, at the start."""
    first = Span("rollout", 0, "h", "rollout", "generate", t0, t0 + validation, validation)
    return [first, *demo_step(t0 + validation, **fault)]


def test_a_step_is_measured_against_earlier_steps_of_its_kind() -> None:
    """Validation every 5th step (the generation twice: 0.8 s more, a third of a step) is no
    slow step once the run has had one: each is measured against the validation steps before
    it. The first, of a kind the run had not had, is measured against the steps before it, and
    the validation it added is its cause. A fault in a validation step is still named."""
    window = A.RollingSteps()
    causes = {}
    for i in range(30):
        validates = i % 5 == 0 and i > 0  # the first at step 5: a kind the run has not had
        fault = {"reward": 1.1} if i == 25 else {}
        spans = with_validation(10.0 * i, **fault) if validates else demo_step(10.0 * i)
        numbers, cause = judged(window, spans)
        if cause is not None:
            causes[i] = cause
        if validates and i >= 10:
            assert numbers["ledger/median"] == pytest.approx(3.1)  # the validation steps'
        elif not validates and i >= 4:
            assert numbers["ledger/median"] == pytest.approx(2.3)  # the others'
    assert sorted(causes) == [5, 25]
    first = causes[5]
    assert (first.bucket, first.role, first.rank, first.phase) == (
        L.WORK,
        "rollout",
        0,
        "rollout/generate",
    )
    assert first.seconds == pytest.approx(0.8)
    late = causes[25]
    assert (late.bucket, late.role, late.phase) == (L.REWARD, "reward", "reward/compute_rewards")
    assert late.seconds == pytest.approx(1.0)
    kinds = window.kinds.keys()
    assert len(kinds) == 2 and any("rollout/generate*2" in k for k in kinds)


def test_a_parallel_role_taking_the_path_over_is_no_rise() -> None:
    """The critic trains beside the actor, a little shorter; in the slow step it ends a
    little later (the path is in the critic's training instead of the actor's) and one
    response is long. The cause is the tail, not the critic's training rising from nothing."""

    def step(t0: float, critic: float, tail: float) -> list[Span]:
        gen_end = t0 + 1.0 + tail
        longest = 60 if tail else 6
        return [
            Span(
                "rollout",
                0,
                "h",
                "rollout",
                "generate",
                t0,
                gen_end,
                1.0 + tail,
                None,
                None,
                None,
                longest,
            ),
            Span("actor_train", 0, "h", "actor_train", "train_step", gen_end, gen_end + 1.0, 1.0),
            Span("critic", 0, "h", "critic", "train_step", gen_end, gen_end + critic, critic),
        ]

    window = A.RollingSteps()
    for i in range(5):
        judged(window, step(10.0 * i, critic=0.95, tail=0.0))
    _, cause = judged(window, step(100.0, critic=1.05, tail=0.6))
    assert cause is not None
    assert (cause.bucket, f"{cause.role}/{cause.rank}", cause.phase) == (
        L.TAIL,
        "rollout/0",
        "rollout/generate",
    )
