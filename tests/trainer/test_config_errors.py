"""``python -m rlpulse.trainer`` with a bad ``--config`` or ``--set`` exits 2 with one line naming the
field and what it expects (issue 17, item 3), before anything heavy starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlpulse.schemas.errors import ConfigError
from rlpulse.trainer.__main__ import main
from rlpulse.trainer.config import load_config


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("trainer: configuration error: "), err
    assert "Traceback" not in err
    return err.removeprefix("trainer: configuration error: ")


def test_missing_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.yaml"
    err = refused(["--config", str(missing)], capsys)
    assert err == f"--config: cannot read {missing}: No such file or directory"


def test_config_file_that_is_not_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("ppo: [1,\n")
    assert refused(["--config", str(bad)], capsys).startswith(f"--config: {bad} is not valid YAML")


@pytest.mark.parametrize(
    "override, message",
    [
        ("ppo.epochs=abc", "ppo.epochs: must be an integer (int) (got 'abc')"),
        ("ppo.epochs=1.5", "ppo.epochs: must be an integer (int) (got 1.5)"),
        ("ppo.actor_lr=fast", "ppo.actor_lr: must be a number (float) (got 'fast')"),
        ("ppo.value_clip=abc", "ppo.value_clip: must be a number (float) or null (got 'abc')"),
        ("cluster.offload=3", "cluster.offload: must be true or false (a bool) (got 3)"),
        ("steps=true", "steps: must be an integer (int), not true/false (got True)"),
        ("ppo.algorithm=dpo", "ppo.algorithm: must be one of ppo, grpo (got 'dpo')"),
    ],
)
def test_override_of_the_wrong_type_names_field_and_type(
    override: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert refused(["--set", override], capsys) == message


def test_override_that_is_not_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    assert refused(["--set", "ppo.epochs=["], capsys).startswith(
        "ppo.epochs: the value '[' is not valid YAML"
    )


def test_right_types_still_load() -> None:
    cfg = load_config(None, ["ppo.epochs=3", "ppo.actor_lr=1", "ppo.value_clip=null"])
    assert (cfg.ppo.epochs, cfg.ppo.actor_lr, cfg.ppo.value_clip) == (3, 1, None)
    for path in sorted(
        (Path(__file__).resolve().parents[2] / "trainer" / "configs").glob("*.yaml")
    ):
        assert load_config(path).run


def test_type_errors_are_config_errors_in_load_config() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, ["model.hidden_size=big"])
    assert info.value.field == "model.hidden_size"
