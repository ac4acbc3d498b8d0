"""``rlpulse samples`` and ``rlpulse compare --samples`` on jsonl files whose samples are real
merged :class:`SampleState` records (two ranks reduced, merged, ``record()``-ed), in process
through ``rlpulse.cli.main`` and once as a subprocess: what is printed, the width kept, the
selections, and one clear line with exit status 2 for each thing that is not there."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rlpulse.cli import main
from rlpulse.runtools.runs import RunFileError
from rlpulse.runtools.samples import load_run_samples
from rlpulse.schemas.samples import SampleLimits, SampleState, reduce_rows

LONG = "word " * 400  # 2,000 chars: cut by the width and the line limit, not by the sender
NAME = "rollout/samples"
VAL = "val/samples"


def state(rank_rows: list[list[dict[str, Any]]], key: str, k: int = 2) -> SampleState:
    """Each rank's rows reduced (deterministic random keys), then merged as the collector does."""
    keys = itertools.count(1)
    parts = [
        reduce_rows(
            rows,
            key,
            origin=("actor_train", rank),
            limits=SampleLimits(k=k),
            keys=lambda: next(keys),
        )
        for rank, rows in enumerate(rank_rows)
    ]
    merged = parts[0]
    for part in parts[1:]:
        merged = merged.merge(part)
    return merged


def rollout_state(offset: float = 0.0) -> SampleState:
    rank0 = [
        {"prompt": f"q{i}", "response": f"a{i}", "reward": i + offset, "advantage": 0.5 * i}
        for i in range(4)
    ]
    rank1 = [
        {"prompt": "long one", "response": LONG, "reward": 10.0 + offset, "advantage": 2.0},
        {"prompt": "worst", "response": "no", "reward": -1.0 + offset, "advantage": -2.0},
        {"prompt": "bad", "reward": "not a number"},  # dropped and counted
    ]
    return state([rank0, rank1], "reward")


def write_run(path: Path, run: str, steps: dict[int, dict[str, SampleState] | None]) -> Path:
    """One line per step; a step maps to its samples by name, or None for a step without."""
    lines = []
    for step, by_name in steps.items():
        record: dict[str, Any] = {"run": run, "step": step, "metrics": {"x": float(step)}}
        if by_name:
            record["samples"] = {name: s.record() for name, s in by_name.items()}
        lines.append(json.dumps(record))
    with path.open("a") as f:
        f.write("\n".join(lines) + "\n")
    return path


@pytest.fixture
def run_file(tmp_path: Path) -> Path:
    val = state([[{"prompt": "1+1=", "response": "2", "score": 1.0}]], "score")
    return write_run(
        tmp_path / "a.jsonl",
        "a",
        {0: None, 1: {NAME: rollout_state()}, 2: {NAME: rollout_state(100.0), VAL: val}, 3: None},
    )


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_last_step_with_samples_every_name_and_set(capsys, run_file: Path) -> None:
    code, out, err = cli(capsys, "samples", str(run_file), "--width", "80")
    assert (code, err) == (0, "")
    headers = [line for line in out.splitlines() if line.startswith("== ")]
    assert headers == [
        f"== step 2  {NAME}  by reward: 6 rows, 1 dropped, 0 cut",
        f"== step 2  {VAL}  by score: 1 rows, 0 dropped, 0 cut",
    ]
    titles = [line for line in out.splitlines() if line.startswith("-- ")]
    assert titles[:3] == [
        "-- top 2 (highest reward)",
        "-- bottom 2 (lowest reward)",
        "-- random 2 (uniform over the 6 rows)",
    ]
    lines = out.splitlines()
    top = lines.index("-- top 2 (highest reward)")
    # Best first, each with its rank, the key's value and the other numbers on its first line.
    assert lines[top + 1] == "#1  actor_train/1  reward=110.0  advantage=2"
    assert lines[top + 2].split() == ["prompt", "long", "one"]
    assert all(len(line) <= 80 for line in lines)
    # The long response: 6 lines (the default), then its full length. Its text column is 66
    # wide (80 less the indent 4, "response" 8 and 2 spaces): 13 words of "word " a line, so
    # 400 words make 31 lines.
    response = lines[top + 3 : lines.index("#2  actor_train/0  reward=103.0  advantage=1.5")]
    assert len(response) == 7 and response[0].split()[:2] == ["response", "word"]
    assert response[-1].strip() == "… 2,000 chars in all, 31 lines (--lines 0: all)"


def test_one_step_one_name_one_set(capsys, run_file: Path) -> None:
    code, out, _ = cli(
        capsys, "samples", str(run_file), "--step", "1", "--name", NAME, "--bottom", "--width", "60"
    )
    assert code == 0
    assert out.splitlines()[:6] == [
        f"== step 1  {NAME}  by reward: 6 rows, 1 dropped, 0 cut",
        "",
        "-- bottom 2 (lowest reward)",
        "#1  actor_train/1  reward=-1  advantage=-2",
        "    prompt    worst",
        "    response  no",
    ]
    assert "-- top" not in out and "-- random" not in out and VAL not in out


def test_lines_zero_shows_a_whole_text(capsys, run_file: Path) -> None:
    code, out, _ = cli(capsys, "samples", str(run_file), "--top", "--lines", "0", "--width", "60")
    assert code == 0 and "chars in all" not in out
    words = [w for line in out.splitlines() for w in line.split() if w == "word"]
    assert len(words) == 400


def test_json_prints_the_selected_rows_as_recorded(capsys, run_file: Path) -> None:
    code, out, _ = cli(capsys, "samples", str(run_file), "--step", "1", "--random", "--json")
    assert code == 0
    got = json.loads(out)
    record = rollout_state().record()
    assert got["run"] == "a" and got["step"] == 1 and list(got["samples"]) == [NAME]
    assert got["samples"][NAME] == {
        "key": "reward",
        "rows": 6,
        "dropped": 1,
        "cut": 0,
        "random": record["random"],
    }


def test_a_row_with_its_own_role_and_rank_fields_shows_where_it_came_from(
    capsys, tmp_path: Path
) -> None:
    s = state([[{"reward": 1.0, "role": "assistant", "rank": 7}]], "reward")
    path = write_run(tmp_path / "r.jsonl", "r", {0: {NAME: s}})
    code, out, _ = cli(capsys, "samples", str(path), "--top", "--width", "60")
    assert code == 0
    assert "#1  actor_train/0  reward=1  rank=7" in out and "role  assistant" in out


def test_control_characters_are_escaped_not_sent_to_the_terminal(capsys, tmp_path: Path) -> None:
    s = state([[{"reward": 1.0, "response": "red\x1b[31m text"}]], "reward")
    path = write_run(tmp_path / "r.jsonl", "r", {0: {NAME: s}})
    code, out, _ = cli(capsys, "samples", str(path), "--top")
    assert code == 0 and "\x1b" not in out and "red\\x1b[31m text" in out


def test_a_replayed_step_counts_once_the_later_line_winning(capsys, tmp_path: Path) -> None:
    path = write_run(tmp_path / "r.jsonl", "r", {0: {NAME: rollout_state()}})
    write_run(path, "r", {0: {NAME: rollout_state(100.0)}})
    assert load_run_samples(path).repeated == 1
    code, out, err = cli(capsys, "samples", str(path), "--top")
    assert code == 0 and "reward=110.0" in out and "reward=10 " not in out
    assert "1 steps appear more than once" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["missing.jsonl"], "missing.jsonl: cannot read: No such file or directory"),
        (["{nosamples}"], "run 'n' has no samples at any step"),
        (["{run}", "--step", "3"], "step 3 of run 'a' has no samples; steps with samples: 1, 2"),
        (["{run}", "--step", "9"], "step 9 of run 'a' has no samples; steps with samples: 1, 2"),
        (["{run}", "--name", "nope"], f"step 2 has no samples named 'nope'; it has {NAME}, {VAL}"),
        (["{both}"], "holds several runs (a, n): choose one with --run"),
        (["{run}", "--run", "b"], "has no run 'b' (it has a)"),
        (["{bad}"], "bad.jsonl:1: not a step record with samples (samples 'x' has no ranking key)"),
    ],
)
def test_what_is_not_there_is_one_line_and_status_2(
    capsys, run_file: Path, tmp_path: Path, argv: list[str], message: str
) -> None:
    nosamples = write_run(tmp_path / "n.jsonl", "n", {0: None, 1: None})
    both = tmp_path / "both.jsonl"
    both.write_text(run_file.read_text() + nosamples.read_text())
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"run": "r", "step": 0, "samples": {"x": {"top": []}}}) + "\n")
    paths = {"run": run_file, "nosamples": nosamples, "both": both, "bad": bad}
    argv = [a.format(**paths) for a in argv]
    code, out, err = cli(capsys, "samples", *argv)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and err.startswith("rlpulse samples: ") and message in err


def test_bad_options_are_usage_errors(capsys, run_file: Path) -> None:
    for argv in (["--top", "--bottom"], ["--width", "10"], ["--lines", "-1"]):
        with pytest.raises(SystemExit) as exc:
            main(["samples", str(run_file), *argv])
        assert exc.value.code == 2
    assert "--width: must be at least 40 columns" in capsys.readouterr().err


def test_as_a_subprocess(run_file: Path) -> None:
    """``python -m rlpulse samples`` as a user types it: the output, and an error's status."""
    command = [sys.executable, "-m", "rlpulse", "samples", str(run_file)]
    done = subprocess.run(
        [*command, "--step", "1", "--top", "--width", "70"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"== step 1  {NAME}  by reward: 6 rows, 1 dropped, 0 cut\n")
    assert all(len(line) <= 70 for line in done.stdout.splitlines())
    failed = subprocess.run([*command, "--step", "0"], capture_output=True, text=True, timeout=120)
    assert failed.returncode == 2 and failed.stdout == ""
    assert failed.stderr.strip().splitlines() == [
        f"rlpulse samples: {run_file}: step 0 of run 'a' has no samples; steps with samples: 1, 2"
    ]


def test_load_names_a_line_that_is_not_a_record(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"run": "r", "step": 0}\nnot json\n')
    with pytest.raises(RunFileError, match=r"r.jsonl:2"):
        load_run_samples(path)


# ---------------------------------------------------------------------------------------------
# compare --samples


@pytest.fixture
def two_runs(tmp_path: Path) -> tuple[Path, Path]:
    a = write_run(tmp_path / "a.jsonl", "a", {1: {NAME: rollout_state()}, 2: None})
    b = write_run(
        tmp_path / "b.jsonl", "b", {1: {NAME: rollout_state(0.5)}, 2: {NAME: rollout_state()}}
    )
    return a, b


def test_compare_samples_side_by_side_when_wide_enough(capsys, two_runs) -> None:
    a, b = two_runs
    code, out, err = cli(capsys, "compare", str(a), str(b), "--samples", "1", "--width", "120")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"== step 1  {NAME}"
    assert lines[1].split(" | ")[0].rstrip() == "[a] by reward: 6 rows, 1 dropped, 0 cut"
    assert lines[1].split(" | ")[1] == "[b] by reward: 6 rows, 1 dropped, 0 cut"
    top = lines.index("-- top (highest reward)")
    first = lines[top + 1].split(" | ")
    assert first[0].rstrip() == "#1  actor_train/1  reward=10  advantage=2"
    assert first[1] == "#1  actor_train/1  reward=10.5  advantage=2"
    assert all(len(line) <= 120 for line in lines)
    assert [x for x in lines if x.startswith("-- ")] == [
        "-- top (highest reward)",
        "-- bottom (lowest reward)",
        "-- random",
    ]


def test_compare_samples_one_after_the_other_when_narrow(capsys, two_runs) -> None:
    a, b = two_runs
    code, out, _ = cli(capsys, "compare", str(a), str(b), "--samples", "1", "--width", "80")
    assert code == 0 and " | " not in out
    lines = out.splitlines()
    top = lines.index("-- top (highest reward)")
    assert lines[top + 1] == "[a]"
    assert lines[top + 2] == "#1  actor_train/1  reward=10  advantage=2"
    assert lines.index("[b]", top) < lines.index("-- bottom (lowest reward)")


def test_compare_samples_a_run_without_the_step_says_so(capsys, two_runs) -> None:
    a, b = two_runs
    code, out, _ = cli(capsys, "compare", str(a), str(b), "--samples", "2", "--width", "120")
    assert code == 0
    assert out.splitlines()[1].startswith("[a] no samples")
    code, _, err = cli(capsys, "compare", str(a), str(b), "--samples", "5")
    assert code == 2
    assert (
        err == "rlpulse compare: no run has samples at step 5 (steps with samples: a: 1; b: 1, 2)\n"
    )
    code, _, err = cli(capsys, "compare", str(a), str(b), "--samples", "1", "--name", "x")
    assert code == 2 and f"no run has samples named 'x' at step 1 (they have {NAME})" in err
    code, _, err = cli(capsys, "compare", str(a), str(b), "--samples", "1", "--key", "ppo.lr")
    assert code == 2 and err == "rlpulse compare: --key: the table's options, not --samples'\n"


def test_compare_samples_out_writes_a_file(capsys, two_runs, tmp_path: Path) -> None:
    a, b = two_runs
    out_file = tmp_path / "samples.txt"
    argv = ["compare", str(a), str(b), "--samples", "1", "--width", "100", "--out", str(out_file)]
    code, out, _ = cli(capsys, *argv)
    assert code == 0 and out == f"{out_file}: samples of 2 runs at step 1\n"
    assert out_file.read_text().startswith(f"== step 1  {NAME}\n")


def test_compare_without_samples_is_the_table_and_refuses_their_options(capsys, two_runs) -> None:
    a, b = two_runs
    code, out, _ = cli(capsys, "compare", str(a), str(b), "--format", "text")
    assert code == 0 and out.splitlines()[0].startswith("run  steps")
    code, _, err = cli(capsys, "compare", str(a), str(b), "--name", NAME)
    assert code == 2 and err == (
        "rlpulse compare: --name: only with --samples STEP (they lay out samples)\n"
    )
