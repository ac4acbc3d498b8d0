"""report and compare on recorded jsonl fixtures (fixtures/record.py re-records them): the
report writes a PNG with the expected panels filled, compare prints the expected numbers."""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path

import pytest

from rlpulse.runtools.cli import main
from rlpulse.runtools.compare import render, table
from rlpulse.runtools.panels import own_names, own_panels, plan
from rlpulse.runtools.runs import RunFileError, load_run, load_runs
from rlpulse.schemas import metrics as M

FIXTURES = Path(__file__).parent / "fixtures"
DEMO = FIXTURES / "demo-synthetic.jsonl"  # scripts/demo_synthetic.py --steps 6 (make demo)
PPO = FIXTURES / "ppo-kl.jsonl"  # KL, entropy, val score, GPU memory; one spike at step 5


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_load_runs_reads_every_step_and_keeps_the_last_copy_of_a_replayed_one(
    tmp_path: Path,
) -> None:
    lines = PPO.read_text().splitlines()
    replay = json.loads(lines[2])
    replay["metrics"][M.ACTOR_REF_KL.name] = 0.5
    path = tmp_path / "replayed.jsonl"
    path.write_text("\n".join([*lines, json.dumps(replay), ""]))
    run = load_run(path)
    assert run.steps == tuple(range(8))
    assert run.max(M.ACTOR_REF_KL.name) == 0.5
    assert load_run(PPO).max(M.ACTOR_REF_KL.name) == 0.125


def test_report_and_compare_warn_about_a_run_appended_twice(tmp_path: Path) -> None:
    """Two jobs under one run name appended to one jsonl: the tools say so (before, compare
    reported the steps once, without a word)."""
    path = tmp_path / "twice.jsonl"
    path.write_text(PPO.read_text() + PPO.read_text())
    assert load_run(path).repeated == 8 and load_run(PPO).repeated == 0
    code, _, err = run_cli("compare", str(path))
    assert code == 0 and "8 steps appear more than once" in err
    code, _, err = run_cli("report", str(path), "--out", str(tmp_path / "r.png"))
    assert code == 0 and "8 steps appear more than once" in err
    assert "appear more than once" not in run_cli("compare", str(PPO))[2]


def test_a_file_with_several_runs_needs_a_name(tmp_path: Path) -> None:
    both = tmp_path / "both.jsonl"
    both.write_text(DEMO.read_text() + PPO.read_text())
    assert list(load_runs(both)) == ["demo-synthetic", "ppo-kl"]
    with pytest.raises(RunFileError, match="several runs"):
        load_run(both)
    assert load_run(both, "ppo-kl").steps == tuple(range(8))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"run": "a", "step": 0, "metrics": {}}\nnot json\n')
    with pytest.raises(RunFileError, match=r"bad.jsonl:2"):
        load_runs(bad)


def test_report_draws_a_png_with_every_panel_the_run_has_data_for(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "ppo.png"
    code, stdout, _ = run_cli("report", str(PPO), "--out", str(out))
    assert code == 0, stdout
    assert png_size(out) == (1536, 760)  # 3 panels a row, 3 rows, and the header
    assert "7 panels of known names, 0 of the run's own names" in stdout
    panels = {p.title: p.names for p in plan(load_run(PPO)).panels}
    gpu = M.MEMORY_GPU.format(
        cluster="actor_train",
        phase="train_step",
        when="end",
        state="onload",
        stat="max_allocated",
        device_id=0,
    )
    assert panels == {
        "Score and reward": ("critic/score/mean", "val/score/mean"),
        "KL to the reference": (M.ACTOR_REF_KL.name, M.ACTOR_KL_LOSS.name),
        "Entropy": ("critic/entropy/mean",),
        "Clip fraction": (M.ACTOR_CLIPFRAC.name,),
        "Lengths": ("tokens/response_length/mean", "tokens/response_length/max"),
        "Throughput": (M.SYSTEM_TPS.name,),
        "GPU memory, peak allocated": (gpu,),
    }


def test_report_on_the_demo_output_uses_its_default_path(tmp_path: Path) -> None:
    demo = tmp_path / "demo-synthetic.jsonl"
    demo.write_text(DEMO.read_text())
    code, _, _ = run_cli("report", str(demo))
    assert code == 0
    assert png_size(tmp_path / "demo-synthetic-report.png")[0] == 1536
    panels = {p.title: p.labels for p in plan(load_run(demo)).panels}
    assert panels["Clip fraction"] == (M.ACTOR_PPO_RATIO_CLIPFRAC.name,)
    assert panels["CPU memory"] == ("actor_train/train_step rss", "critic/compute_values rss")
    assert "KL to the reference" not in panels  # the demo logs no KL: no empty panel


def test_report_draws_the_runs_own_names_and_leaves_out_empty_panels(tmp_path: Path) -> None:
    """A job that logs names of its own (issue 40: its report was eight "not logged" panels):
    its names are drawn, grouped by their first segment (names without one together), and the
    catalog panels without data are left out of the picture."""
    jsonl = tmp_path / "own.jsonl"
    names = [f"my/loss_{i}" for i in range(8)] + ["eval/accuracy", "bare", "other"]
    jsonl.write_text(
        "".join(
            json.dumps(
                {
                    "run": "own",
                    "step": step,
                    "metrics": {n: float(step + i) for i, n in enumerate(names)}
                    | {M.ACTOR_CLIPFRAC.name: 0.1},
                }
            )
            + "\n"
            for step in range(4)
        )
    )
    run = load_run(jsonl)
    assert own_names(run) == sorted(names)
    own = {p.title: p.names for p in own_panels(run)}
    assert list(own) == ["own names", "eval/*", "my/* (1)", "my/* (2)"]
    assert own["my/* (1)"] == tuple(sorted(names[:8])[:6])
    assert own["my/* (2)"] == tuple(sorted(names[:8])[6:])
    assert own["eval/*"] == ("eval/accuracy",)
    assert own["own names"] == ("bare", "other")
    out = tmp_path / "own.png"
    code, stdout, _ = run_cli("report", str(jsonl), "--out", str(out))
    assert code == 0
    assert "1 panels of known names, 4 of the run's own names" in stdout
    assert png_size(out) == (1536, 520)  # 5 panels drawn, in 2 rows: no empty catalog panels


EXPECTED_MARKDOWN = """\
| run            | steps | final val/score/mean | best (step) val/score/mean | final critic/score/mean | best (step) critic/score/mean | final actor/pg_loss | max actor/ref_kl | mean system/tps | ppo.lr | ppo.batch_size |
| -------------- | ----: | -------------------: | -------------------------: | ----------------------: | ----------------------------: | ------------------: | ---------------: | --------------: | ------ | -------------- |
| demo-synthetic | 6     | -                    | -                          | 0.375                   | 0.375 (2)                     | -0.02292            | -                | 6695.5          | 1e-06  | 32             |
| ppo-kl         | 8     | 0.55                 | 0.55 (7)                   | 0.8                     | 0.8 (7)                       | -                   | 0.125            | 20012.8         | 3e-06  | -              |
"""


def test_compare_prints_the_expected_numbers_and_config_values(tmp_path: Path) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("ppo: {lr: 1.0e-6, batch_size: 32}\n")
    b.write_text("ppo: {lr: 3.0e-6}\n")
    code, stdout, _ = run_cli(
        "compare",
        str(DEMO),
        str(PPO),
        "--config",
        str(a),
        "--config",
        str(b),
        "--key",
        "ppo.lr",
        "--key",
        "ppo.batch_size",
    )
    assert code == 0
    assert stdout == EXPECTED_MARKDOWN
    # The same numbers straight from the files: the demo's mean tps over the 5 steps with one
    # (the first step has none), the KL spike at step 5, the last validation score.
    demo = [json.loads(line)["metrics"] for line in DEMO.read_text().splitlines()]
    tps = [m[M.SYSTEM_TPS.name] for m in demo if M.SYSTEM_TPS.name in m]
    assert len(tps) == 5 and f"{sum(tps) / 5:.1f}" == "6695.5"


def test_compare_text_format_forced_metrics_and_output_file(tmp_path: Path) -> None:
    out = tmp_path / "table.txt"
    code, stdout, err = run_cli(
        "compare",
        str(PPO),
        "--format",
        "text",
        "--score",
        "critic/score/mean",
        "--kl",
        M.ACTOR_KL_LOSS.name,
        "--out",
        str(out),
    )
    assert code == 0 and stdout.startswith(str(out))
    assert err == ""  # no loss column (ppo-kl logs none), without a word: not a score
    assert out.read_text().splitlines() == [
        "run     steps  final critic/score/mean  best (step) critic/score/mean  max actor/kl_loss  mean system/tps",
        "ppo-kl  8      0.8                      0.8 (7)                        0.04               20012.8",
    ]


def test_compare_picks_up_config_yaml_next_to_the_run_and_labels_clashing_names(
    tmp_path: Path,
) -> None:
    for name in ("x", "y"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text(PPO.read_text())
    (tmp_path / "x" / "config.yaml").write_text("seed: 7\n")
    runs = [load_run(tmp_path / n / "metrics.jsonl") for n in ("x", "y")]
    assert render(table(runs, ["x", "y"], configs=[{"seed": 7}, None], keys=["seed"]), "text")
    code, stdout, _ = run_cli(
        "compare",
        str(tmp_path / "x" / "metrics.jsonl"),
        str(tmp_path / "y" / "metrics.jsonl"),
        "--key",
        "seed",
    )
    assert code == 0
    rows = stdout.splitlines()[2:]
    assert rows[0].startswith(f"| ppo-kl ({tmp_path / 'x' / 'metrics.jsonl'})")
    assert rows[0].rstrip(" |").endswith("7") and rows[1].rstrip(" |").endswith("-")


def test_bad_input_is_a_message_and_exit_code_2(tmp_path: Path) -> None:
    code, _, err = run_cli("report", str(tmp_path / "missing.jsonl"))
    assert code == 2 and "cannot read" in err
    code, _, err = run_cli("compare", str(PPO), str(DEMO), "--config", str(PPO))
    assert code == 2 and "--config given 1 times for 2 jsonl files" in err
