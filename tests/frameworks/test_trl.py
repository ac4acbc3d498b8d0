"""A real TRL ``GRPOTrainer`` on CPU (tiny Llama from a config, local tokenizer and prompts)
streaming through ``RlpulseCallback`` to a real collector, in one process and in two
(``torchrun``): the collector's values against TRL's own ``log_history``, and the worker-side
metrics of the README against the tokens every process trained on."""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch
import yaml

pytest.importorskip(
    "trl", reason="TRL is not installed: `make install-integrations` (.venv-integrations)"
)

from rlpulse.schemas import metrics as M
from rlpulse.schemas.reductions import Stat
from tests.frameworks.grpo_job import ROOT, load_example, recording
from tests.frameworks.helpers import (
    jsonl_collector,
    no_reads_from_rlpulse,
    readme_block,
    records,
    samples_supported,
    spans,
)
from tests.support.net import free_port

PER_PROCESS = {"step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second"}
"""What each process times itself (the rest TRL gathers: the same on every process)."""
ADV = M.CRITIC_ADVANTAGES.output_names()
LENGTH = M.RESPONSE_LENGTH.output_names()


EXACT = ("loss", "entropy", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean")
GENERATION = ("rollout/generate", "reward/compute_rewards")
"""The phases of a process's training generation."""
"""What ``RlpulseCallback()`` logs per micro-batch for the example's GRPO (dapo, beta 0)."""


def assert_matches_log_history(got: dict[int, dict], log_history: list[dict]) -> int:
    """Every number TRL logged, but the :data:`EXACT` ones, is in the collector's record of its
    step, exactly; returns how many were compared."""
    compared = 0
    for entry in log_history:
        metrics = got[entry["step"]]["metrics"]
        for name, value in entry.items():
            if name == "step" or not isinstance(value, (int, float)) or not math.isfinite(value):
                continue
            if name in EXACT and "loss" in entry:  # a training step's log (not the summary)
                continue
            assert metrics[name] == float(value), (entry["step"], name)
            compared += 1
    return compared


def assert_worker_side_exact(record: dict, seen: list[dict]) -> None:
    """The step's pooled advantages and lengths over every micro-batch and process."""
    advantages = [a for s in seen for a in s["advantages"]]
    lengths = [n for s in seen for n in s["lengths"]]
    metrics = record["metrics"]
    assert metrics[ADV[Stat.MEAN]] == pytest.approx(
        math.fsum(advantages) / len(advantages), abs=1e-9
    )
    assert metrics[ADV[Stat.MAX]] == max(advantages) and metrics[ADV[Stat.MIN]] == min(advantages)
    assert metrics[LENGTH[Stat.MEAN]] == pytest.approx(sum(lengths) / len(lengths), rel=1e-12)


def exact_against_truth(record: dict, seen: list[dict], trl_log: dict) -> dict[str, dict]:
    """The step's :data:`EXACT` metrics: the collector's value equals the token-pooled truth
    recomputed from every micro-batch of every process (within 1e-6); returns, per name, the
    truth, the collector's value and TRL's own logged value."""
    out = {}
    for name in EXACT:
        total = math.fsum(s["truth"][name][0] for s in seen)
        tokens = sum(s["truth"][name][1] for s in seen)
        exact = total / tokens
        got = record["metrics"][name]
        assert got == pytest.approx(exact, abs=1e-6), (name, got, exact)
        out[name] = {"truth": exact, "rlpulse": got, "trl": trl_log[name]}
    return out


def test_grpo_in_one_process_matches_log_history(tmp_path, monkeypatch) -> None:
    example = load_example()
    namespace: dict = {}
    with jsonl_collector(tmp_path) as (collector, out):
        monkeypatch.setenv("RLPULSE_ADDRESS", collector.address)
        monkeypatch.chdir(tmp_path)  # the callback saves runs/<run>/config.yaml here
        exec(readme_block("### TRL"), namespace)  # the README's one switch: the callback
        rlpulse = namespace["rlpulse"]
        tokenizer = example.build_tokenizer()
        trainer = recording(namespace["GRPOTrainer"])(  # TRL's class, only recorded
            model=example.tiny_model(tokenizer),
            reward_funcs=example.reward_length,
            args=example.grpo_config(str(tmp_path / "trainer"), steps=3),
            train_dataset=example.prompts(),
            processing_class=tokenizer,
            callbacks=[rlpulse],
        )
        trainer.seen = []
        trainer.train()
        assert rlpulse.producer is None  # closed at the end of training
    got = records(out)
    assert sorted(got) == [1, 2, 3]
    assert all(
        r["run"] == "grpo-tiny" and not r["partial"] and r["ranks"] == 1 for r in got.values()
    )
    log_history = trainer.state.log_history
    assert assert_matches_log_history(got, log_history) >= 3 * 20
    assert set(rlpulse.exact_names) == set(EXACT)
    for step, record in got.items():
        (train_log,) = [e for e in log_history if e["step"] == step and "loss" in e]
        exact_against_truth(record, [s for s in trainer.seen if s["step"] == step], train_log)
    assert rlpulse.stats()["repeated"] == 0  # the final summary repeats epoch, same value
    saved = yaml.safe_load((tmp_path / "runs" / "grpo-tiny" / "config.yaml").read_text())
    assert saved["training_args"]["learning_rate"] == trainer.args.learning_rate
    assert saved["model"]["model_type"] == "llama" and saved["model"]["hidden_size"] == 16
    # the collector recorded it with the run, on its first step
    recorded = got[1]["config"]
    assert recorded["training_args"]["learning_rate"] == trainer.args.learning_rate
    assert recorded["model"]["hidden_size"] == 16 and "config" not in got[2]


def test_grpo_in_two_processes_streams_every_rank(tmp_path) -> None:
    run = "grpo-two"
    with jsonl_collector(tmp_path, trace=True) as (collector, out):
        env = {
            **os.environ,
            "RLPULSE_ADDRESS": collector.address,
            "OMP_NUM_THREADS": "1",
            "GLOO_SOCKET_IFNAME": "lo",
        }
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            "--master_addr=127.0.0.1",
            f"--master_port={free_port()}",
            str(ROOT / "tests" / "frameworks" / "grpo_job.py"),
            str(tmp_path),
            run,
        ]
        done = subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280
        )
        assert done.returncode == 0, done.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"test-rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    got = records(out)
    assert sorted(got) == [1, 2, 3, 4]
    assert all(r["run"] == run and not r["partial"] and r["ranks"] == 2 for r in got.values())
    main, other = ranks[0]["log_history"], ranks[1]["log_history"]
    assert (
        assert_matches_log_history(got, main) >= 2 * 20
    )  # completions/* and rewards only at the 2 generations
    # TRL's values are the same on both processes, but for each process's own clock.
    for a, b in zip(main, other, strict=True):
        differ = {k for k in a if a[k] != b.get(k)}
        assert differ <= PER_PROCESS, differ
    differences, ragged = {}, []
    for step, record in got.items():
        seen = [s for r in ranks for s in r["seen"] if s["step"] == step]
        assert {len(s["lengths"]) for s in seen} == {4} and len(seen) == 4  # 2 x 2 micro-batches
        ragged.append(len({s["truth"]["entropy"][1] for s in seen}) > 1)  # token counts differ
        assert_worker_side_exact(record, seen)
        (train_log,) = [e for e in main if e["step"] == step and "loss" in e]
        differences[step] = exact_against_truth(record, seen, train_log)
    print(json.dumps(differences, indent=1))  # TRL's own values against the truth (-s)
    assert any(ragged) and any(
        d["clip_ratio/region_mean"]["truth"] > 0 for d in differences.values()
    )
    # TRL averages its per-micro-batch means of entropy: not the token-pooled value.
    assert (
        max(abs(d["entropy"]["trl"] - d["entropy"]["truth"]) for d in differences.values()) > 1e-4
    )
    # Each process's generation and scoring (every 2 optimizer steps) and every optimizer
    # step are phases of its own rank, at the step that first trains on them.
    phases = {(s["phase"], s["rank"], s["step"]) for s in spans(tmp_path, run)}
    expected = {(p, rank, step) for rank in (0, 1) for step in (1, 3) for p in GENERATION}
    expected |= {("actor_train/train_step", rank, step) for rank in (0, 1) for step in got}
    assert phases == expected, phases ^ expected
    for step in (1, 3):  # two ranks ran each: the straggler's rank is one of them
        for phase in GENERATION:
            cluster, name = phase.split("/")
            lag = M.STRAGGLER.format(cluster=cluster, phase=name, stat="slowest_rank")
            assert got[step]["metrics"][lag] in (0.0, 1.0)
    if samples_supported():  # each process logs its own completions (TRL gathered them all)
        counts = {step: r["metrics"].get(M.ROLLOUT_SAMPLES.name) for step, r in got.items()}
        # A generation every 2 optimizer steps (PROOF: 4 micro-batches of 4 per generation and
        # process), 16 rows per process: 32 rows, not 64 (no process logs another's rows).
        assert counts == {1: 32.0, 2: None, 3: 32.0, 4: None}
        # The random 8 of a step's 32 rows come from one process alone with probability
        # 2 * C(16, 8) / C(32, 8) = 0.24%; over both steps' 16 random rows, 3e-6. So the
        # processes' rows are checked over both steps: a rank missing from all of them says
        # its rows never reached the merge (or its keys repeat the other's).
        random_ranks: set[int] = set()
        for step in (1, 3):
            samples = got[step]["samples"][M.ROLLOUT_SAMPLES.name]
            random_ranks |= {r["rank"] for r in samples["random"]}
            assert samples["top"][0]["reward"] >= samples["bottom"][0]["reward"]
        assert random_ranks == {0, 1}


def test_the_phases_read_no_tensor_and_add_no_collective(tmp_path, monkeypatch) -> None:
    """``RlpulseCallback``'s phases alone (``exact=False, samples=False``) on TRL's GRPO in one
    process: every tensor read (``.item()``, ``.tolist()``...) and collective from rlpulse's
    code fails the test while TRL trains; each step's generation, scoring and optimizer step
    are still phases, at the step that trains on them."""
    example = load_example()
    run = "grpo-guarded"
    with jsonl_collector(tmp_path, trace=True) as (collector, out):
        monkeypatch.chdir(tmp_path)
        callback = example.RlpulseCallback(
            collector.address, run=run, exact=False, samples=False, config_dir=None
        )
        tokenizer = example.build_tokenizer()
        trainer = example.GRPOTrainer(
            model=example.tiny_model(tokenizer),
            reward_funcs=example.reward_length,
            args=example.grpo_config(str(tmp_path / "trainer"), steps=2),
            train_dataset=example.prompts(),
            processing_class=tokenizer,
            callbacks=[callback],
        )
        with no_reads_from_rlpulse():
            trainer.train()
    assert sorted(records(out)) == [1, 2]
    phases = {(s["phase"], s["rank"], s["step"]) for s in spans(tmp_path, run)}
    expected = {(p, 0, step) for step in (1, 2) for p in (*GENERATION, "actor_train/train_step")}
    assert phases == expected


def readme_commands() -> list[str]:
    """The README's TRL commands (its bash block), one per line, comments left out."""
    block = readme_block("### TRL", lang="bash")
    return [line.split("#")[0].strip() for line in block.splitlines() if line.split("#")[0].strip()]


def test_the_example_options_reach_the_script_through_torchrun() -> None:
    """torchrun's parser refuses an option after the script that abbreviates two of its own
    (issue 21: ``--run`` could be ``--run-path`` or ``--run_path``)."""
    from torch.distributed.run import get_args_parser

    options = [o for a in load_example().arguments()._actions for o in a.option_strings]
    script_args = [arg for o in options if o.startswith("--") for arg in (o, "x")]
    parsed = get_args_parser().parse_args(["--nproc_per_node", "2", "grpo.py", *script_args])
    assert parsed.training_script_args == script_args


def test_the_readme_commands_run_as_written(tmp_path) -> None:
    """The README's commands, typed in a checkout (here: a directory whose ``examples`` is
    the repository's): the collector from ``examples/trl/collector.yaml``, then the
    ``torchrun`` line as written; the ``python`` line's options parse."""
    collector_line, python_line, torchrun_line = readme_commands()
    assert collector_line.endswith("&") and torchrun_line.startswith("RLPULSE_ADDRESS=")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    bin_dir = os.path.dirname(sys.executable)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",  # python and torchrun of this environment
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo",  # a loopback-only test namespace has no other interface
    }
    ready = tmp_path / "ready"
    command = collector_line.rstrip("&").split()
    assert command[:2] == ["rlpulse", "collector"]
    log = (tmp_path / "collector.log").open("w")
    collector = subprocess.Popen(
        [os.path.join(bin_dir, "rlpulse"), *command[1:], "--ready-file", str(ready)],
        cwd=tmp_path,
        env=env,
        stderr=log,
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert collector.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        done = subprocess.run(
            torchrun_line,
            shell=True,
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=280,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-4000:]
    finally:
        collector.terminate()
        assert collector.wait(30) == 0
        log.close()
    args = load_example().arguments().parse_args(shlex.split(python_line)[3:])
    assert args.run_name == "grpo-tiny"
    got = [json.loads(line) for line in (tmp_path / "runs/grpo-tiny/metrics.jsonl").open()]
    assert [r["step"] for r in got] == [1, 2, 3]
    assert all(r["run"] == "grpo-tiny-2" and r["ranks"] == 2 and not r["partial"] for r in got)


class FakeAccelerator:
    num_processes = 1

    def reduce(self, tensor, reduction="sum"):
        return tensor.clone()  # one process: the sum over processes is the tensor


class FakeTrainer:
    """What ``LossHook`` touches of a TRL trainer; ``calls`` reduce pairs per micro-batch."""

    loss_type = "bnpo"
    current_gradient_accumulation_steps = 2

    def __init__(self, pairs):
        self.pairs = pairs
        self.accelerator = FakeAccelerator()
        self.state = SimpleNamespace(global_step=6)

    def compute_loss(self, model, inputs):
        for pair in self.pairs:
            self.accelerator.reduce(torch.tensor(pair), reduction="sum")
        return torch.tensor(0.25)  # bnpo: the micro-batch's token mean, halved for accumulation


class Recorder:
    def __init__(self):
        self.calls = []

    def log(self, data, step):
        self.calls.append((step, dict(data)))


def test_the_hook_logs_trls_own_pairs_and_stops_cleanly_where_they_do_not_fit(
    monkeypatch,
) -> None:
    from rlpulse.producer import Fraction, Weighted
    from rlpulse.producer.integrations.trl_loss import LossHook

    hook = LossHook((("entropy", "mean"), ("clip_ratio/low_mean", "fraction")), "tokens")
    assert hook.reductions() == {
        "entropy": "mean",
        "clip_ratio/low_mean": "fraction",
        "loss": "mean",
    }
    inputs = {"completion_mask": torch.tensor([[1, 1, 0], [1, 0, 0]])}
    model = SimpleNamespace(training=True)
    trainer, producer, told = FakeTrainer([(6.0, 3.0), (1.0, 3.0)]), Recorder(), []
    detach = hook.attach(trainer, producer, told.append)
    with monkeypatch.context() as m:  # the hook reads nothing back: no .item(), no sync
        for method in ("item", "tolist", "cpu", "numpy", "__float__", "__bool__"):
            m.setattr(torch.Tensor, method, lambda *a, _m=method: pytest.fail(f"hook: {_m}"))
        loss = trainer.compute_loss(model, inputs)
    assert float(loss) == 0.25  # TRL's loss, unchanged
    ((step, data),) = producer.calls
    assert step == 7 and set(data) == {"entropy", "clip_ratio/low_mean", "loss"}
    entropy, clipped, loss = data["entropy"], data["clip_ratio/low_mean"], data["loss"]
    assert isinstance(entropy, Weighted) and (float(entropy.value), float(entropy.weight)) == (2, 3)
    assert isinstance(clipped, Fraction) and (
        float(clipped.numerator),
        float(clipped.denominator),
    ) == (1, 3)
    assert (float(loss.value), float(loss.weight)) == (0.5, 3)  # un-scaled, over 3 tokens
    trainer.compute_loss(SimpleNamespace(training=False), inputs)  # evaluation: not logged
    assert len(producer.calls) == 1 and not told
    detach()
    assert "compute_loss" not in vars(trainer) and "reduce" not in vars(trainer.accelerator)

    short, producer = FakeTrainer([(6.0, 3.0)]), Recorder()  # one pair where two are expected
    hook.attach(short, producer, told.append)
    short.compute_loss(model, inputs)
    short.compute_loss(model, inputs)
    assert producer.calls == [] and len(told) == 1 and "2 expected" in told[0]


def test_an_untested_trl_version_stops_grpo_naming_it(monkeypatch) -> None:
    import trl

    from rlpulse.producer.integrations.trl_loss import LossHook
    from rlpulse.schemas.errors import ConfigError

    grpo = object.__new__(trl.GRPOTrainer)  # isinstance is all it needs before the check
    monkeypatch.setattr(trl, "__version__", "1.99.0")
    with pytest.raises(ConfigError, match=r"TRL 1\.99\.0 is not a version"):
        LossHook.for_trainer(grpo)
    assert LossHook.for_trainer(SimpleNamespace()) is None  # not a trainer it hooks


def test_rloo_entropy_and_loss_are_pooled_with_the_callback_alone(tmp_path) -> None:
    """RLOO's sequence-level loss and its token entropy, exact over the micro-batches of a step,
    recomputed here from the model's log-probabilities and the batch."""
    from trl import RLOOConfig, RLOOTrainer

    from rlpulse.producer.integrations.trl import RlpulseCallback

    class Recording(RLOOTrainer):
        seen: list[dict]
        _forwards: list | None = None

        def _get_per_token_logps_and_entropies(self, *args, **kwargs):
            out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
            if self._forwards is not None:
                self._forwards.append(out)
            return out

        def compute_loss(self, model, inputs, *args, **kwargs):
            self._forwards = []
            try:
                loss = super().compute_loss(model, inputs, *args, **kwargs)
            finally:
                ((logps, entropies, _),), self._forwards = self._forwards, None
            mask = inputs["completion_mask"].double()
            ratio = torch.exp(
                (logps.detach().double() * mask).sum(1) - inputs["old_logps"].double()
            )
            adv = inputs["advantages"].double()
            clipped = torch.clamp(ratio, 1 - self.epsilon_low, 1 + self.epsilon_high)
            self.seen.append(
                {
                    "step": self.state.global_step + 1,
                    "loss": [(-torch.min(ratio * adv, clipped * adv)).sum().item(), len(adv)],
                    "entropy": [
                        (entropies.detach().double() * mask).sum().item(),
                        mask.sum().item(),
                    ],
                }
            )
            return loss

    example = load_example()
    tokenizer = example.build_tokenizer()
    settings = {
        f: getattr(example.grpo_config(str(tmp_path / "t")), f)
        for f in ("per_device_train_batch_size", "gradient_accumulation_steps", "num_generations")
    }
    with jsonl_collector(tmp_path) as (collector, out):
        rlpulse = RlpulseCallback(collector.address, run="rloo", config_dir=None)
        trainer = Recording(
            model=example.tiny_model(tokenizer, init_std=0.5),
            reward_funcs=example.reward_length,
            args=RLOOConfig(
                output_dir=str(tmp_path / "trainer"),
                max_completion_length=8,
                max_steps=2,
                logging_steps=1,
                report_to=[],
                use_cpu=True,
                save_strategy="no",
                seed=0,
                learning_rate=0.05,
                steps_per_generation=4,
                beta=0.0,  # no reference model to download
                **settings,
            ),
            train_dataset=example.prompts(),
            processing_class=tokenizer,
            callbacks=[rlpulse],
        )
        trainer.seen = []
        trainer.train()
    assert set(rlpulse.exact_names) == {"entropy", "loss"}
    got = records(out)
    assert sorted(got) == [1, 2]
    for step, record in got.items():
        seen = [s for s in trainer.seen if s["step"] == step]
        for name in ("loss", "entropy"):
            truth = math.fsum(s[name][0] for s in seen) / sum(s[name][1] for s in seen)
            assert record["metrics"][name] == pytest.approx(truth, abs=1e-6), (step, name)


def test_trls_next_engine_is_built_with_statistics_once(monkeypatch) -> None:
    """``enable_engine_stats`` (the callback's ``on_init_end`` with ``vllm_mode="colocate"``):
    TRL's next ``LLM(...)`` gets ``disable_log_stats=False`` unless it says otherwise, and the
    name is TRL's own again after it; where TRL's module has no ``LLM`` (no vLLM), nothing.
    A real engine through it: ``test_trl_vllm.py``."""
    from trl.generation import vllm_generation

    from rlpulse.producer.integrations.trl_phases import enable_engine_stats

    built = []
    monkeypatch.setattr(vllm_generation, "LLM", lambda **kw: built.append(kw), raising=False)
    own = vllm_generation.LLM
    enable_engine_stats()
    vllm_generation.LLM(model="m", disable_log_stats=True)  # an explicit value is kept
    vllm_generation.LLM(model="m")
    assert built == [{"model": "m", "disable_log_stats": True}, {"model": "m"}]
    assert vllm_generation.LLM is own
    restore = enable_engine_stats()
    vllm_generation.LLM(model="m")
    assert built[-1] == {"model": "m", "disable_log_stats": False}
    restore()  # unused: a no-op; used before it: the name back
    enable_engine_stats()()
    assert vllm_generation.LLM is own
    monkeypatch.delattr(vllm_generation, "LLM")
    enable_engine_stats()()  # no vLLM: nothing to do
    assert not hasattr(vllm_generation, "LLM")
