"""``rlpulse compare`` on runs of verl, TRL and the README's worker (issue 45 item 7: every
column was "-" for them), and a ``--score`` or ``--kl`` no run logged: exit 2, naming the name
and the nearest names the runs did log (it printed a table of "-" before)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rlpulse.runtools.cli import main
from rlpulse.runtools.compare import table
from rlpulse.runtools.runs import load_run
from rlpulse.schemas import frameworks as F, metrics as M

FIXTURES = Path(__file__).parent / "fixtures"
VERL = FIXTURES / "verl.jsonl"
TRL = FIXTURES / "trl.jsonl"
README_WORKER = FIXTURES / "readme-worker.jsonl"
PPO = FIXTURES / "ppo-kl.jsonl"


def compare(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["compare", *argv], stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def values(path: Path, name: str) -> list[float]:
    """``name``'s value at every step that has it, read straight from the jsonl lines."""
    records = [json.loads(line)["metrics"] for line in path.read_text().splitlines()]
    return [m[name] for m in records if name in m]


def cells(path: Path) -> dict[str, str]:
    t = table([load_run(path)])
    (row,) = t.rows
    return dict(zip(t.header, row, strict=True))


def test_a_trl_run_fills_the_score_loss_and_kl_columns() -> None:
    got = cells(TRL)
    reward = values(TRL, F.TRL_REWARD)
    assert got["final reward"] == f"{reward[-1]:.4g}"
    assert got["best (step) reward"] == f"{max(reward):.4g} ({reward.index(max(reward)) + 1})"
    assert got["final loss"] == f"{values(TRL, F.TRL_LOSS)[-1]:.4g}"
    assert got["max kl"] == f"{max(values(TRL, F.TRL_KL)):.4g}"
    assert list(got) == [
        "run",
        "steps",
        "final reward",
        "best (step) reward",
        "final loss",
        "max kl",
    ]


def test_a_verl_run_fills_every_column_under_verls_names() -> None:
    got = cells(VERL)
    val = "val-core/reverse/reward/mean@1"
    assert got[f"final {val}"] == f"{values(VERL, val)[-1]:.4g}"
    assert got["final critic/score/mean"] == f"{values(VERL, 'critic/score/mean')[-1]:.4g}"
    assert got["final actor/pg_loss"] == f"{values(VERL, 'actor/pg_loss')[-1]:.4g}"
    assert got[f"max {F.VERL_REWARD_KL}"] == f"{max(values(VERL, F.VERL_REWARD_KL)):.4g}"
    tps = values(VERL, F.VERL_THROUGHPUT)
    assert got[f"mean {F.VERL_THROUGHPUT}"] == f"{sum(tps) / len(tps):.4g}"


def test_the_readme_workers_run_shows_its_loss_and_says_it_has_no_score() -> None:
    code, out, err = compare(str(README_WORKER), "--format", "text")
    assert code == 0
    header, row = out.splitlines()
    assert header.split() == ["run", "steps", "final", M.ACTOR_PG_LOSS.name]
    assert row.split() == ["hello", "5", f"{values(README_WORKER, M.ACTOR_PG_LOSS.name)[-1]:.4g}"]
    assert err.startswith("rlpulse compare: note: no run logged a score (val/score/mean, ")


def test_runs_that_log_a_metric_under_different_names_each_get_their_column() -> None:
    t = table([load_run(PPO), load_run(TRL)])
    assert t.header[2:8] == (
        "final val/score/mean",
        "best (step) val/score/mean",
        "final critic/score/mean",
        "best (step) critic/score/mean",
        "final reward",
        "best (step) reward",
    )
    ppo, trl = t.rows
    assert ppo[6:8] == ("-", "-") and trl[4:6] == ("-", "-")
    assert trl[6] == f"{values(TRL, F.TRL_REWARD)[-1]:.4g}"


def test_a_score_or_kl_no_run_logged_is_exit_2_with_the_nearest_names() -> None:
    code, out, err = compare(str(TRL), "--score", "rewrd")
    assert (code, out) == (2, "")
    assert err == (
        "rlpulse compare: --score rewrd: no run logged it; did you mean reward, reward_std?\n"
    )
    code, out, err = compare(str(PPO), str(TRL), "--kl", "actor/ref_k")
    assert (code, out) == (2, "")
    assert (
        err == "rlpulse compare: --kl actor/ref_k: no run logged it; did you mean actor/ref_kl?\n"
    )
    code, out, err = compare(str(PPO), "--score", "zzz")
    assert code == 2 and "--score zzz: no run logged it (no logged name is close to it)" in err
    code, out, _ = compare(str(TRL), "--score", F.TRL_REWARD)  # a name some run logged: fine
    assert code == 0 and "final reward" in out
