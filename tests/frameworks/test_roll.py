"""ROLL's integration end to end on the stand-in for ROLL's contract (``rollstub``; ROLL itself
cannot be installed here: ``test_roll_real.py`` runs against a checkout), through a real
collector: the YAML block's hooks as Ray calls them, the tracker in ROLL's registry, the exact
worker metrics of two ranks holding 8 and 55 tokens, phases per rank, a skipped step that does
not wait for workers, the trained and validation generations as samples, the run's config,
no ``finish()``, and a resumed run that re-logs its history."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from tests.frameworks import roll_standin_job as job  # noqa: E402
from tests.frameworks.helpers import ROOT, jsonl_collector, readme_block, records  # noqa: E402

RUN = "roll-standin"
TOKENS = ["<pad>", "<eos>", *"abcdefghi"]
"""The stand-in tokenizer's vocabulary (``rollstub``'s ``CharTokenizer``): one character a token."""


def run_job(
    tmp_path: Path, address: str, steps: int, history: Path | None = None, out: Path | None = None
) -> dict:
    stats = tmp_path / f"stats-{steps}-{history is not None}.json"
    argv = [
        sys.executable,
        str(ROOT / "tests/frameworks/roll_standin_job.py"),
        address,
        RUN,
        str(steps),
    ]
    if history is not None:
        argv += ["--resume", str(history)]
    done = subprocess.run(
        [*argv, str(stats), *([str(out)] if out else [])],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(stats.read_text())


def truth(step: int) -> dict[str, float]:
    """float64 truth over both ranks' pooled tokens (token-mean) and sequences."""
    clipped = tokens = pg = 0.0
    ratio_sum = sequences = 0.0
    crit: list[float] = []
    for rank in (0, 1):
        d = job.rank_data(step, rank)
        mask = d["response_mask"][:, 1:]
        labels = d["input_ids"][:, 1:] * mask
        logp = (
            torch.log_softmax(d["logits"][:, :-1], -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        )
        for i in range(mask.shape[0]):
            row_ratio = []
            for t in range(mask.shape[1]):
                if not mask[i, t]:
                    continue
                r = float(torch.exp(logp[i, t] - d["old_log_probs"][i, t]))
                a = float(d["advantages"][i, t])
                pg += -min(r * a, min(max(r, 0.8), 1.2) * a)
                clipped += r < 0.8 or r > 1.2
                tokens += 1
                row_ratio.append(r)
            if row_ratio:
                ratio_sum += sum(row_ratio) / len(row_ratio)
                sequences += 1
                v = d["values_out"][i, :-1, 0]
                errs = [
                    float((v[t] - d["returns"][i, t]) ** 2)
                    for t in range(mask.shape[1])
                    if mask[i, t]
                ]
                crit.append(0.5 * sum(errs) / len(errs))
    return {
        "actor/pg_loss": pg / tokens,
        "actor/ppo_ratio_clipfrac": clipped / tokens,
        "actor/ratio_mean": ratio_sum / sequences,
        "critic/loss": sum(crit) / len(crit),
        "critic/clipfrac": 0.0,
    }


def decode(ids: Any) -> str:
    return "".join(TOKENS[i] for i in ids.tolist())


def expected_rows(tensors: dict[str, Any], objects: dict[str, list[str]]) -> list[dict[str, Any]]:
    """Every row of a batch as the driver should log it, texts included (float64 truth)."""
    tokens = tensors["response_mask"][:, 1:].bool()
    rows = []
    for i in range(tensors["input_ids"].shape[0]):
        ids, n = tensors["input_ids"][i], int(tokens[i].sum())
        row: dict[str, Any] = {
            "score": float(tensors["scores"][i]),
            "response_length": n,
            "prompt_length": job.PROMPT,
            "prompt": decode(ids[: job.PROMPT]),
            "response": decode(ids[job.PROMPT : job.PROMPT + n]),
            "tag": objects["tag"][i],
        }
        if "advantages" in tensors:
            adv = tensors["advantages"][i][tokens[i]]
            row["advantage"] = float(adv.sum() / n) if n else None
            row["reward"] = float(tensors["token_level_rewards"][i].sum())
            row["trained"] = bool(tensors["final_response_mask"][i].any())
            row["domain"] = objects["domain"][i]
        rows.append(row)
    return rows


def check_samples(state: dict[str, Any], rows: list[dict[str, Any]], ties: bool = False) -> None:
    """A recorded samples state against every row of the batch: all counted, the best and
    worst k by score (any of the tied ones with ``ties``), k random ones, each a row of the
    batch as it was, from the driver."""
    k = job.SAMPLES_K
    assert (state["rows"], state["dropped"], state["cut"], state["key"]) == (
        len(rows),
        0,
        0,
        "score",
    )
    for part in ("top", "bottom", "random"):
        assert len(state[part]) == k
        for got in state[part]:
            assert (got.pop("role"), got.pop("rank")) == ("driver", 0)
            assert any(got == pytest.approx(row) for row in rows), got
    scores = sorted(r["score"] for r in rows)
    assert [r["score"] for r in state["top"]] == scores[::-1][:k]
    assert [r["score"] for r in state["bottom"]] == scores[:k]
    if not ties:
        best = sorted(rows, key=lambda r: -r["score"])[:k]
        assert state["top"] == [pytest.approx(r) for r in best]


def check_trained_step(rec: dict[str, Any], logged: dict[str, Any], step: int) -> None:
    """A step the workers trained: the hook's exact values (float64 truth over both ranks'
    pooled tokens), not ROLL's; every rank's phases; the driver's samples of its batch."""
    want, m = truth(step), rec["metrics"]
    for name, value in want.items():
        assert m[name] == pytest.approx(value, rel=1e-9, abs=1e-12), (step, name)
        assert rec["roles"][name] in ("actor_train", "critic"), name  # worker-side
    assert "tokens/response_length/mean" in m and "token/response_length/mean" not in m
    # ROLL's own values (the stand-in's micro-batch means) are not what was recorded
    assert logged["critic/clipfrac"] == pytest.approx(2 * logged["critic/loss"])
    assert abs(logged["actor/ratio_mean@sum"] / 4 - want["actor/ratio_mean"]) > 1e-4
    # every rank's phases: the straggler view of the train step over both ranks
    assert m["straggler/actor_train/train_step/slowest_rank"] in (0.0, 1.0)
    assert "time/critic/train_step/total" in m
    # the driver's samples: the trained batch's rows, decoded
    check_samples(rec["samples"]["rollout/samples"], expected_rows(*job.driver_batch(step)))
    assert m["rollout/samples"] == 9.0 and rec["roles"]["rollout/samples"] == "driver"


def test_the_yaml_block_end_to_end_through_a_collector(tmp_path: Path) -> None:
    """One job of 3 steps, the second skipped; the process ends without ``finish()``."""
    with jsonl_collector(tmp_path) as (collector, out):
        first = run_job(tmp_path, collector.address, steps=3, out=out)
    recs = records(out)
    assert sorted(recs) == [0, 1, 2]
    for step, rec in recs.items():
        assert not rec["partial"], (step, rec["missing"])
        m = rec["metrics"]
        assert not any("@" in name for name in m), sorted(m)
        assert m["actor/lr"] == 1e-6 and rec["roles"]["actor/lr"] == "driver"
    # the skipped step went out while the workers idled: nobody waited for them
    assert first["logged"][job.SKIPPED]["emitted_before_next_step"] is True
    skipped = recs[job.SKIPPED]["metrics"]
    assert skipped["mask/final_mask_sum_eq_0"] == 1.0 and "actor/pg_loss" not in skipped
    assert "time/actor_train/model_update/total" in skipped
    assert "samples" not in recs[job.SKIPPED]  # no batch was trained, no validation ran
    for step in (0, 2):
        check_trained_step(recs[step], first["logged"][step], step)
        val = recs[step]["samples"]["val/samples"]
        check_samples(val, expected_rows(*job.val_batch(step)), ties=True)
    assert first["tracker"]["worker_side"] > 0 and first["tracker"]["dropped_late"] == 0
    counts = {
        k: first["tracker"][k] for k in ("samples_logged", "val_samples_logged", "samples_failed")
    }
    assert counts == {"samples_logged": 2, "val_samples_logged": 2, "samples_failed": 0}
    # the run's config: saved beside the driver, and recorded by the collector on step 0
    config = tmp_path / "runs" / RUN / "config.yaml"
    assert "loss_agg_mode: token-mean" in config.read_text()
    assert recs[0]["config"]["loss_agg_mode"] == "token-mean"
    assert recs[0]["config"]["tracker_kwargs"]["run"] == RUN
    assert [s for s, r in recs.items() if "config" in r] == [0]


@pytest.mark.slow
def test_a_resumed_run_re_logs_its_history_and_each_step_is_recorded_once(
    tmp_path: Path,
) -> None:
    """The job again, then resumed from its history in a new process (ROLL re-logs the whole
    history under the old steps): each step once, the repeats told back as late, the new step
    exact, and the resumed job's config (it differs: ``resume_from_checkpoint``) recorded on
    the first step it emitted."""
    with jsonl_collector(tmp_path) as (collector, out):
        first = run_job(tmp_path, collector.address, steps=3, out=out)
        history = tmp_path / "history.json"
        history.write_text(json.dumps(first["logged"]))
        resumed = run_job(tmp_path, collector.address, steps=1, history=history)
    recs = records(out)
    assert sorted(recs) == [0, 1, 2, 3]  # each step once, history re-logged included
    assert not any(rec["partial"] for rec in recs.values())
    check_trained_step(recs[3], resumed["logged"][0], 3)
    assert "val/samples" not in recs[3]["samples"]
    # the re-logged history was already recorded: left out by the collector and told back
    assert resumed["tracker"]["dropped_late"] > 0
    assert [s for s, r in recs.items() if "config" in r] == [0, 3]
    assert (
        recs[0]["config"]["resume_from_checkpoint"],
        recs[3]["config"]["resume_from_checkpoint"],
    ) == (False, True)


def test_ray_hook_chains_the_users_hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    stub = "roll" not in sys.modules  # real ROLL (ROLL_SRC) may be loaded: its registry will do
    if stub:
        sys.path.insert(0, str(job.STUB))
    try:
        from rlpulse.producer.integrations import roll as rlpulse_roll

        monkeypatch.setenv(rlpulse_roll.CHAIN_VAR, f"{__name__}.users_runtime_env_hook")
        env = rlpulse_roll.ray_hook({"worker_process_setup_hook": "my.setup"})
        assert env["users_hook_ran"] is True
        assert env["worker_process_setup_hook"] == rlpulse_roll.SETUP_HOOK
        assert env["env_vars"][rlpulse_roll.NEXT_SETUP_VAR] == "my.setup"
        import roll.utils.tracking as tracking

        assert tracking.tracker_registry["rlpulse"].__name__ == "RlpulseTracker"
        rlpulse_roll.unregister()
        assert "rlpulse" not in tracking.tracker_registry
    finally:
        if stub:
            sys.path.remove(str(job.STUB))
            for name in [n for n in sys.modules if n == "roll" or n.startswith("roll.")]:
                del sys.modules[name]


def users_runtime_env_hook(env: dict[str, Any]) -> dict[str, Any]:
    return {**env, "users_hook_ran": True}


def test_the_docs_yaml_block_is_the_one_the_hooks_read() -> None:
    """docs/integrations.md's ROLL block, as written: it names the hook ray_hook is, and its
    tracker_kwargs are settings the tracker and the workers accept."""
    import yaml

    from rlpulse.producer.integrations import roll as rlpulse_roll
    from rlpulse.producer.integrations.roll_settings import RollSettings

    block = yaml.safe_load(readme_block("### ROLL", "yaml"))
    assert block["track_with"] == "rlpulse"
    assert block["system_envs"]["RAY_RUNTIME_ENV_HOOK"] == rlpulse_roll.RUNTIME_ENV_HOOK
    kwargs = {k: v.replace("${exp_name}", "grpo") for k, v in block["tracker_kwargs"].items()}
    settings = RollSettings.from_config({"exp_name": "grpo"}, kwargs)
    assert (settings.run, settings.address) == ("grpo", "tcp://collector-host:5555")


def test_a_roll_function_unlike_the_one_the_samples_hook_wraps_is_left_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A ROLL whose ``add_all_metrics`` takes other parameters keeps it as it is, and says so;
    the functions that fit are wrapped."""
    import types

    from rlpulse.producer.integrations.roll_samples import SamplesHooks

    class MetricsManager:
        def add_all_metrics(self, step, data):  # not (global_step, batch): another ROLL
            return None

    class DataProto:
        def pop(self, batch_keys=None, non_tensor_batch_keys=None, meta_info_keys=None):
            return None

    managers = types.ModuleType("roll.utils.metrics.metrics_manager")
    managers.MetricsManager = MetricsManager  # type: ignore[attr-defined]
    protocol = types.ModuleType("roll.distributed.scheduler.protocol")
    protocol.DataProto = DataProto  # type: ignore[attr-defined]
    hooks = SamplesHooks()
    with caplog.at_level("WARNING", logger="rlpulse.integrations.roll"):
        hooks._wrap(managers)
        hooks._wrap(protocol)
    assert MetricsManager.__dict__["add_all_metrics"].__name__ == "add_all_metrics"
    assert not getattr(MetricsManager.add_all_metrics, "_rlpulse_samples_of", False)
    assert "takes ('self', 'step', 'data') first" in caplog.text
    assert getattr(DataProto.pop, "_rlpulse_samples_of", False)
    hooks.uninstall()
    assert not getattr(DataProto.pop, "_rlpulse_samples_of", False)
