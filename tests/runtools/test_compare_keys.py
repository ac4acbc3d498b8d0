"""``compare --key`` with a key no run's configuration has: a warning on stderr naming the
key and the nearest keys that exist, and the table all the same (issue 17, item 4)."""

from __future__ import annotations

import io
from pathlib import Path

from rlpulse.runtools.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
PPO = FIXTURES / "ppo-kl.jsonl"
TRAINER_LIKE = "ppo: {actor_lr: 0.0005, critic_lr: 0.001, target_kl: null}\nseed: 0\n"


def compare(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["compare", *argv], stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_a_key_no_run_has_is_warned_about_and_the_table_still_prints(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(TRAINER_LIKE)
    code, out, err = compare(str(PPO), "--config", str(config), "--key", "ppo.lr")
    assert code == 0
    assert err == (
        "rlpulse compare: warning: --key ppo.lr is in no run's configuration (its column "
        "shows -); did you mean ppo.actor_lr, ppo.critic_lr?\n"
    )
    header, _, row = out.splitlines()
    assert header.rstrip(" |").endswith("ppo.lr") and row.rstrip(" |").endswith("-")


def test_keys_that_exist_are_not_warned_about_even_when_null(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(TRAINER_LIKE)
    argv = [str(PPO), "--config", str(config), "--key", "ppo.actor_lr", "--key", "ppo.target_kl"]
    code, out, err = compare(*argv)
    assert (code, err) == (0, "")
    assert "0.0005" in out.splitlines()[2]


def test_no_configuration_at_all_says_where_one_comes_from() -> None:
    code, out, err = compare(str(PPO), "--key", "ppo.actor_lr")
    assert code == 0 and out
    assert "--key ppo.actor_lr: no run has a configuration" in err
    assert "config.yaml" in err


def test_the_config_the_collector_recorded_in_the_jsonl_gives_the_key_columns(
    tmp_path: Path,
) -> None:
    """Each run's own ``config`` (on the step after it arrived; a later one replaces it) is
    its configuration: two runs in one file, and a config.yaml beside it for neither."""
    import json

    lines = [
        {
            "run": "a",
            "step": 0,
            "metrics": {"critic/score/mean": 1.0},
            "config": {"actor": {"lr": 1e-6}},
        },
        {
            "run": "b",
            "step": 0,
            "metrics": {"critic/score/mean": 1.0},
            "config": {"actor": {"lr": 2e-6}},
        },
        {
            "run": "a",
            "step": 1,
            "metrics": {"critic/score/mean": 2.0},
            "config": {"actor": {"lr": 3e-6}},
        },
        {"run": "b", "step": 1, "metrics": {"critic/score/mean": 2.0}},
    ]
    path = tmp_path / "runs.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    (tmp_path / "config.yaml").write_text("actor: {lr: 9.0}\n")  # the file's: runs have theirs
    code, out, err = compare(str(path), "--key", "actor.lr")
    assert (code, err) == (0, "")
    rows = {line.split("|")[1].strip(): line for line in out.splitlines()[2:]}
    assert "3e-06" in rows["a"] and "2e-06" in rows["b"]
