"""``rlpulse why``: a step's ledger against the run's median step, read back from jsonl; the
slowest step by default; errors that say what is missing (exit 2)."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import msgspec

from rlpulse.cli import main as rlpulse
from rlpulse.runtools.cli import main as run_tools
from rlpulse.schemas import ledger as L
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
        "run demo, step 5: 5.300 s; the median step (of its 5 other steps of its kind) 3.900 s: "
        "+1.400 s (+36%)"
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


def validating(record: StepRecord, more: float) -> StepRecord:
    """``record`` as a validation step: the generation ran twice, ``more`` seconds longer."""
    ledger = record.ledger
    assert ledger is not None
    wall = record.metrics[L.LEDGER_WALL.name] + more
    return dataclasses.replace(
        record,
        ledger=msgspec.structs.replace(ledger, runs={**ledger.runs, "rollout/generate": 2}),
        metrics={**record.metrics, L.LEDGER_WALL.name: wall},
    )


def test_a_step_is_set_beside_the_steps_of_its_kind(tmp_path: Path) -> None:
    """A step that ran the generation twice (a validation step) beside the other such steps,
    as the collector judges it; a kind the run had once, beside all the others."""
    recs = records(n=8, slow=99)  # every step 3.9 s
    recs[2], recs[6] = validating(recs[2], 1.0), validating(recs[6], 1.2)
    path = jsonl(tmp_path, recs)
    first = why(str(path), "--step", "6")[1].splitlines()[0]
    assert first == (
        "run demo, step 6: 5.100 s; the median step (of its 1 other steps of its kind) 4.900 s: "
        "+0.200 s (+4%)"
    )
    plain = why(str(path), "--step", "3")[1].splitlines()[0]
    assert "(of its 5 other steps of its kind) 3.900 s" in plain
    recs = records(n=8, slow=99)
    recs[6] = validating(recs[6], 1.2)  # the run's only step of its kind
    path = jsonl(tmp_path, recs)
    assert "(of its 7 other steps) 3.900 s: +1.200 s" in why(str(path), "--step", "6")[1]


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
