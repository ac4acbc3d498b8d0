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
