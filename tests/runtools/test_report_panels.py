"""What ``rlpulse report`` draws for each kind of run (issue 45 item 6; issue 48: "draws what a
user of any of them now has"): the demo trainer's losses, rollout health, engine, phases,
stragglers and samples; verl's and TRL's names under the titles they mean; the README worker's
names; the names logged but not drawn, counted and listed; and the figure itself (legends beside
the lines, one colour per line, counts and times from 0, whole steps).

The fixtures are real runs (``fixtures/record.py``): the demo trainer on Ray with vLLM, verl's
metric code through verl's ``Tracking`` and the ``rlpulse`` backend, TRL's ``GRPOTrainer`` with
``RlpulseCallback``, the README's worker as written; each through a collector.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from matplotlib.colors import to_hex

from rlpulse.runtools.cli import main
from rlpulse.runtools.panels import ENGINE, HEALTH, own_names, plan
from rlpulse.runtools.report import figure
from rlpulse.runtools.runs import load_run
from rlpulse.runtools.samples import load_run_samples
from rlpulse.schemas import engine as E, frameworks as F, metrics as M
from rlpulse.schemas.reductions import Stat

FIXTURES = Path(__file__).parent / "fixtures"
TRAINER = FIXTURES / "trainer.jsonl"
VERL = FIXTURES / "verl.jsonl"
TRL = FIXTURES / "trl.jsonl"
README_WORKER = FIXTURES / "readme-worker.jsonl"


def panels(path: Path) -> dict[str, tuple[str, ...]]:
    return {p.title: p.names for p in plan(load_run(path)).panels}


def logged_names(path: Path) -> set[str]:
    return {n for line in path.read_text().splitlines() for n in json.loads(line)["metrics"]}


def quantiles(h: object) -> tuple[str, ...]:
    return tuple(e.name for e in h.quantile_entries.values())  # type: ignore[attr-defined]


def test_the_demo_trainers_losses_rollout_health_engine_phases_and_samples_are_drawn() -> None:
    got = panels(TRAINER)
    out = {e.name: e.output_names() for e in M.ENTRIES}
    assert got["Policy loss"] == (
        M.ACTOR_PG_LOSS.name,
        M.ACTOR_WEIGHTED_PG_LOSS.name,
        M.ACTOR_TOTAL_LOSS.name,
    )
    assert got["Value loss"] == (M.CRITIC_LOSS.name, M.CRITIC_ERROR.name)
    diff = out[M.ROLLOUT_LOGPROB_DIFF.name]
    assert got[HEALTH + "rollout minus trainer log-prob"] == tuple(
        diff[s] for s in (Stat.P50, Stat.P90, Stat.P99, Stat.MEAN)
    )
    staleness = out[M.ASYNC_STALENESS.name]
    assert got[HEALTH + "staleness"] == (staleness[Stat.MEAN], staleness[Stat.MAX])
    assert got[ENGINE + "tokens"] == (
        E.ENGINE_PROMPT_TOKENS.name,
        E.ENGINE_GENERATION_TOKENS.name,
        E.ENGINE_PREFIX_CACHE_HITS.name,
    )
    assert got[ENGINE + "KV cache"] == (
        E.ENGINE_KV_CACHE_USAGE.name,
        E.ENGINE_PREFIX_CACHE_HIT_RATE.name,
    )
    assert got[ENGINE + "time to first token"] == quantiles(E.ENGINE_TTFT)
    assert got[ENGINE + "end-to-end latency"] == quantiles(E.ENGINE_E2E_LATENCY)
    assert got[ENGINE + "inter-token latency"] == quantiles(E.ENGINE_ITL)
    assert got[ENGINE + "queue time"] == quantiles(E.ENGINE_QUEUE_TIME)
    # Every phase's total (the slowest rank's), over panels of at most 10 lines
    phases = [n for t, names in got.items() if t.startswith("Phase time") for n in names]
    totals = sorted(
        n for n in logged_names(TRAINER) if n.startswith("time/") and n.endswith("/total")
    )
    assert sorted(phases) == totals and len(totals) == 11
    assert [len(names) for t, names in got.items() if t.startswith("Phase time")] == [6, 5]
    lag = M.STRAGGLER.format(cluster="actor_train", phase="train_step", stat="lag")
    assert lag in got["Stragglers: slowest rank's lag behind the median"]
    assert got["Samples logged"] == (M.ROLLOUT_SAMPLES.name, M.VAL_SAMPLES.name)
    assert own_names(load_run(TRAINER)) == []  # every name is the catalog's


def test_the_header_counts_every_name_logged_drawn_or_not() -> None:
    """ "logged, not drawn: N names" instead of calling names not logged; the histogram buckets
    behind the quantiles drawn are counted as such; the sample rows' steps and command."""
    run = load_run(TRAINER)
    the_plan = plan(run, load_run_samples(TRAINER))
    drawn = {n for p in the_plan.panels for n in p.names}
    logged = logged_names(TRAINER)
    buckets = {n for n in logged if "/bucket/" in n}
    assert the_plan.logged == len(logged) > 250  # the demo's every name
    assert set(the_plan.not_drawn) == logged - drawn - buckets
    assert the_plan.buckets == len(buckets) > 0
    assert len(drawn) + the_plan.buckets + len(the_plan.not_drawn) == the_plan.logged
    header = "\n".join(the_plan.header(run))
    assert f"{len(logged)} names logged: {len(drawn)} drawn, {len(buckets)} histogram" in header
    assert f"logged, not drawn: {len(the_plan.not_drawn)} names (" in header
    assert "not logged" not in header
    assert f"rlpulse samples {TRAINER} --step 3" in header
    assert "samples (rollout/samples, val/samples) at steps 0, 1, 2, 3" in header


def test_verl_names_are_drawn_under_the_titles_they_mean() -> None:
    got = panels(VERL)
    assert got["Score and reward"] == (
        "critic/score/mean",
        "critic/rewards/mean",
        "val-core/reverse/reward/mean@1",
    )
    assert got["Policy loss"] == (M.ACTOR_PG_LOSS.name, F.VERL_ACTOR_LOSS)
    assert got["Value loss"] == (M.CRITIC_LOSS.name, F.VERL_VF_LOSS)
    assert got["KL to the reference"] == (F.VERL_REWARD_KL, M.ACTOR_KL_LOSS.name)
    assert got["KL to the old policy"] == (F.VERL_PPO_KL,)
    assert got["Entropy"] == (F.VERL_ENTROPY,)
    assert got["Clip fraction"] == (
        F.VERL_PG_CLIPFRAC,
        M.ACTOR_PG_CLIPFRAC_LOWER.name,
        F.VERL_VF_CLIPFRAC,
    )
    assert got["Lengths"] == (
        F.VERL_RESPONSE_LENGTH_MEAN,
        F.VERL_RESPONSE_LENGTH_MAX,
        F.VERL_PROMPT_LENGTH_MEAN,
    )
    assert got["Throughput"] == (F.VERL_THROUGHPUT,)
    assert got[HEALTH + "rollout minus trainer probability"] == (
        F.VERL_ROLLOUT_PROBS_DIFF_MEAN,
        F.VERL_ROLLOUT_PROBS_DIFF_MAX,
    )
    timing = {n for n in logged_names(VERL) if n.startswith(F.VERL_TIMING_PREFIX)}
    assert set(got["Driver stages"]) == timing and len(timing) == 10
    assert got["GPU memory, peak allocated"] == (
        F.VERL_MAX_MEMORY_ALLOCATED,
        F.VERL_MAX_MEMORY_RESERVED,
    )
    assert got["Gradient norm"] == (F.VERL_ACTOR_GRAD_NORM, F.VERL_CRITIC_GRAD_NORM)
    mapped = {n for title, names in got.items() if "*" not in title for n in names}
    assert not mapped & set(own_names(load_run(VERL)))  # none also drawn as the run's own


def test_trl_names_are_drawn_under_the_titles_they_mean() -> None:
    got = panels(TRL)
    assert got["Score and reward"] == (F.TRL_REWARD, "rewards/reward_length/mean")
    assert got["Policy loss"] == (F.TRL_LOSS,)
    assert got["KL to the reference"] == (F.TRL_KL,)
    assert got["Entropy"] == (F.TRL_ENTROPY,)
    assert got["Clip fraction"] == (
        F.TRL_CLIP_REGION,
        F.TRL_CLIP_HIGH,
        F.TRL_CLIP_LOW,
        F.TRL_CLIP_HIGH_MAX,
        F.TRL_CLIP_LOW_MIN,
    )
    assert got["Lengths"][-2:] == (F.TRL_COMPLETION_MEAN_LENGTH, F.TRL_COMPLETION_MAX_LENGTH)
    assert got["Driver stages"] == (F.TRL_STEP_TIME,)
    assert got["Learning rate"] == (F.TRL_LEARNING_RATE,)
    assert got["Gradient norm"] == (F.TRL_GRAD_NORM,)
    assert got["Samples logged"] == (M.ROLLOUT_SAMPLES.name,)
    # TRL's other names are the run's own: drawn, the bare ones together
    assert "own names (1)" in got and "completions/*" in got


def test_the_readme_workers_names_are_drawn() -> None:
    got = panels(README_WORKER)
    assert got["Policy loss"] == (M.ACTOR_PG_LOSS.name,)
    assert got["Clip fraction"] == (M.ACTOR_CLIPFRAC.name,)
    assert got["Advantages, returns and values"] == ("critic/advantages/mean",)
    assert got["Phase time, slowest rank"] == ("time/actor_train/train_step/total",)
    assert got["Learning rate"] == (M.ACTOR_LR.name,)
    assert got["my/*"] == ("my/reward_bonus",)


@pytest.mark.parametrize("path", [TRAINER, VERL, TRL, README_WORKER], ids=lambda p: p.stem)
def test_the_figure_keeps_legends_off_the_lines_colours_apart_from_zero_and_whole_steps(
    path: Path,
) -> None:
    """The small things seen in the issue: the CPU memory legend covered its lines, two lines
    shared a colour, the throughput axis did not start at 0, step ticks were fractional. The
    demo trainer's figure is rendered (its layout applied, seconds); the others are checked as
    built, which is where the legends' anchors, the colours and the limits are set."""
    run = load_run(path)
    the_plan = plan(run)
    fig = figure(run, the_plan)
    if path == TRAINER:
        fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    assert len(fig.axes) == len(the_plan.panels)
    for ax, panel in zip(fig.axes, the_plan.panels, strict=True):
        legend = ax.get_legend()
        assert not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))
        colours = [to_hex(line.get_color()) for line in ax.get_lines()]
        assert len(set(colours)) == len(colours) >= len(panel.lines), panel.title
        low, high = ax.get_xlim()
        assert (low, high) == (run.steps[0] - 0.5, run.steps[-1] + 0.5)
        ticks = [t for t in ax.get_xticks() if low <= t <= high]
        assert ticks and all(float(t).is_integer() for t in ticks), (panel.title, ticks)
        if panel.zero:
            assert ax.get_ylim()[0] == 0.0, panel.title
            top = max(v for name in panel.names for v in run.curve(name)[1])
            assert ax.get_ylim()[1] >= top
    zero = {p.title for p in the_plan.panels if p.zero}
    assert zero >= {"Throughput", "CPU memory", "Lengths"} & {p.title for p in the_plan.panels}


def test_the_command_prints_the_names_not_drawn(tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    path = README_WORKER
    code = main(["report", str(path), "--out", str(tmp_path / "r.png")], stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    first, second = out.getvalue().splitlines()
    assert first.endswith("6 panels of known names, 1 of the run's own names")
    not_drawn = plan(load_run(path)).not_drawn
    assert second == f"logged, not drawn: {len(not_drawn)} names: {', '.join(not_drawn)}"
    assert "critic/advantages/max" in not_drawn and len(not_drawn) == 9
