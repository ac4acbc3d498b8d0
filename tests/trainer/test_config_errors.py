"""``python -m rlpulse.trainer`` with a bad ``--config`` or ``--set`` exits 2 with one line naming the
field and what it expects (issue 17, item 3), before anything heavy starts."""

from __future__ import annotations

import importlib.util
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


# --- rollout.backend=vllm on a model vLLM cannot run (issue 45, item 11) -------------------

VLLM_INSTALLED = importlib.util.find_spec("vllm") is not None
CPU = ["--set", "cluster.device=cpu"]  # vLLM's CPU build is what refuses (on CUDA it runs them)


@pytest.mark.parametrize(
    "overrides, field, problem",
    [
        (["model.num_heads=4"], "model.num_heads", "head size 16 (model.hidden_size / model."),
        (
            ["model.max_position_embeddings=8192", "rollout.kv_cache_mb=1"],
            "rollout.kv_cache_mb",
            "one sequence of model.max_position_embeddings (8192) tokens, at least 8.0 MiB",
        ),
    ],
    ids=["head-size-16", "kv-cache-too-small"],
)
def test_a_model_vllm_refuses_is_one_line_before_ray_and_leaves_no_run(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    overrides: list[str],
    field: str,
    problem: str,
) -> None:
    """It was a 33 s Ray crash (exit 1, an ActorDiedError traceback) that left an empty run
    directory behind, so the corrected rerun became ``reverse-2``."""
    sets = [arg for o in ["rollout.backend=vllm", *overrides] for arg in ("--set", o)]
    argv = ["--run", "reverse", "--output-dir", str(tmp_path / "runs"), *CPU, *sets]
    err = refused(argv, capsys)
    if VLLM_INSTALLED:
        assert err.startswith(f"{field}: ") and problem in err, err
    else:
        assert err.startswith("rollout.backend: vLLM is not installed: run `make install`"), err
    assert "\n" not in err
    assert not (tmp_path / "runs").exists()  # nothing to rename the rerun to reverse-2


def test_every_shipped_config_and_the_default_is_a_model_vllms_cpu_build_runs() -> None:
    """``rlpulse train`` with no ``--config``, and every config in trainer/configs, rolls out
    with vLLM where it is installed (the default model had 4 heads of 16, which only HF
    generate ran)."""
    from rlpulse.trainer.rollout_vllm import cpu_refusal

    configs = sorted((Path(__file__).resolve().parents[2] / "trainer" / "configs").glob("*.yaml"))
    for cfg in [load_config(None), *map(load_config, configs)]:
        assert cpu_refusal(cfg.model, cfg.rollout) is None, cfg.run
