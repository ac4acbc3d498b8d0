"""``rlpulse why``: a step's ledger against the run's median step, read back from jsonl; the
slowest step by default; errors that say what is missing (exit 2)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rlpulse.cli import main as rlpulse
from rlpulse.runtools.cli import main as run_tools
from rlpulse.schemas.record import StepRecord
from tests.collector.sinks.test_ledger_views import records


def jsonl(tmp_path: Path, recs: list[StepRecord]) -> Path:
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r.to_json()) + "\n" for r in recs))
    return path


def why(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = run_tools(["why", *argv], stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_a_slow_step_against_the_median_step(tmp_path: Path) -> None:
    path = jsonl(tmp_path, records())
    code, out, _ = why(str(path), "--step", "5")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == (
        "run demo, step 5: 5.300 s; the median step (of its 5 other steps) 3.900 s: +1.400 s (+36%)"
    )
    assert lines[1].startswith("step 5 5.30 s = rollout 2.00")
    assert lines[2].startswith(
        "cause (named by the collector against its rolling median): "
        "reward reward/0 reward/compute_rewards, +1.400 s, 100% of the excess"
    )
    table = {ln.split()[0]: ln.split()[1:] for ln in lines[4:] if ln and not ln.startswith(" ")}
    assert table["reward"] == ["1.500", "0.100", "+1.400"]
    assert table["path/actor_train/train_step/straggler"] == ["0.500", "0.500", "+0.000"]
    assert "critical path of step 5 (seconds after its start):" in lines
    assert lines[-1].split()[-2:] == ["actor_train/1", "actor_train/train_step"]
    # without --step: the slowest step, the same one here
    assert why(str(path))[1] == out


def test_what_it_cannot_answer_exits_2_naming_it(tmp_path: Path) -> None:
    path = jsonl(tmp_path, records())
    code, _, err = why(str(path), "--step", "40")
    assert code == 2 and "step 40 has no ledger" in err and "0, 1, 2, 3, 4, 5" in err
    bare = jsonl(tmp_path, [StepRecord(run="r", step=0, metrics={"x": 1.0})])
    code, _, err = why(str(bare))
    assert code == 2 and "no step of run 'r'" in err and "producer.phase()" in err
    two = tmp_path / "two.jsonl"
    two.write_text(
        "".join(json.dumps(StepRecord(run=n, step=0, metrics={}).to_json()) + "\n" for n in "ab")
    )
    code, _, err = why(str(two))
    assert code == 2 and "holds several runs (a, b): choose one" in err


def test_the_rlpulse_command_runs_it(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = jsonl(tmp_path, records())
    assert rlpulse(["why", str(path), "--step", "2"]) == 0
    assert capsys.readouterr().out.startswith("run demo, step 2: ")


def test_the_docs_command_as_written(tmp_path: Path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """docs/ledger.md's ``rlpulse why`` line, run where a demo run's jsonl lies."""
    import shlex

    from tests.docs import doc_block

    (command,) = doc_block("docs/ledger.md", "## Where to read it", "bash").splitlines()
    argv = shlex.split(command)
    assert argv[0] == "rlpulse"
    (tmp_path / "runs" / "demo").mkdir(parents=True)
    jsonl(tmp_path / "runs" / "demo", records(n=14, slow=12))
    monkeypatch.chdir(tmp_path)
    assert rlpulse(argv[1:]) == 0
    out = capsys.readouterr().out
    assert out.startswith("run demo, step 12: ") and "cause (named by the collector" in out
