"""TRL's completions as ``rollout/samples``: a real ``GRPOTrainer`` tiny run on CPU with
``RlpulseCallback``, against what TRL's reward functions were given and what TRL keeps in its
``_logs``; each process's own slice of TRL's gathered rows; the hook's guard."""

from __future__ import annotations

import logging
import math
from collections import defaultdict, deque
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip(
    "trl", reason="TRL is not installed: `make install-integrations` (.venv-integrations)"
)

from trl import GRPOTrainer

from rlpulse.producer import Samples
from rlpulse.producer.integrations.trl import RlpulseCallback
from rlpulse.producer.integrations.trl_samples import SamplesHook
from rlpulse.schemas import metrics as M
from tests.frameworks.grpo_job import load_example
from tests.frameworks.helpers import NO_SAMPLES, jsonl_collector, records, samples_supported

WEIGHTS = [1.0, 0.5]
NAME = M.ROLLOUT_SAMPLES.name


class RecordingProducer:
    """A producer double: what the callback's producer was asked to log."""

    def __init__(self, *args, **kwargs):
        self.calls = []
        self.config = None

    def run_config(self, config):
        self.config = config
        return True

    def log(self, data, step):
        self.calls.append((step, dict(data)))

    def step_done(self, step):
        pass

    def close(self):
        pass

    def stats(self):
        return {"unacked": 0, "dropped_send": 0}


def run_grpo(tmp_path, callback, steps=3):
    """The example's tiny GRPO on CPU (two reward functions, weighted), with ``callback``;
    returns the trainer and, per generation, what the second reward function was given and
    returned (prompts, completions, rewards), and the first function's rewards."""
    example = load_example()
    given = []

    def reward_short(prompts, completions, **kwargs):
        rewards = [-len(c) / 20.0 for c in completions]
        given.append(
            {
                "prompts": list(prompts),
                "completions": list(completions),
                "reward_length": example.reward_length(completions),
                "reward_short": rewards,
            }
        )
        return rewards

    tokenizer = example.build_tokenizer()
    trainer = GRPOTrainer(
        model=example.tiny_model(tokenizer),
        reward_funcs=[example.reward_length, reward_short],
        args=example.grpo_config(str(tmp_path / "trainer"), steps=steps, reward_weights=WEIGHTS),
        train_dataset=example.prompts(),
        processing_class=tokenizer,
        callbacks=[callback],
    )
    trainer.train()
    return trainer, given


def expected_rows(generation):
    return [
        {
            "prompt": p,
            "response": c,
            "reward": pytest.approx(WEIGHTS[0] * a + WEIGHTS[1] * b, abs=1e-6),
            "rewards/reward_length": pytest.approx(a, abs=1e-6),
            "rewards/reward_short": pytest.approx(b, abs=1e-6),
        }
        for p, c, a, b in zip(
            generation["prompts"],
            generation["completions"],
            generation["reward_length"],
            generation["reward_short"],
            strict=True,
        )
    ]


def test_grpo_logs_each_generations_completions_as_samples(tmp_path) -> None:
    producers = []

    def factory(*args, **kwargs):
        producers.append(RecordingProducer())
        return producers[-1]

    callback = RlpulseCallback(run="grpo-samples", config_dir=None, producer_factory=factory)
    trainer, given = run_grpo(tmp_path, callback)
    (producer,) = producers
    logged = [(step, data[NAME]) for step, data in producer.calls if NAME in data]
    # One generation per optimizer step here (steps_per_generation = 2 micro-batches).
    assert [step for step, _ in logged] == [1, 2, 3] and len(given) == 3
    for (_, samples), generation in zip(logged, given, strict=True):
        assert isinstance(samples, Samples) and samples.key == "reward" and samples.k is None
        rows = [{k: v for k, v in r.items() if k != "advantage"} for r in samples.rows]
        assert rows == expected_rows(generation)  # what TRL scored, in TRL's order
        assert all(math.isfinite(r["advantage"]) for r in samples.rows)
    # The last generation's advantages are those TRL keeps for log_completions.
    assert [r["advantage"] for r in logged[-1][1].rows] == list(trainer._logs["advantages"])
    assert callback.stats()["samples_logged"] == 3 and callback.stats()["samples_failed"] == 0
    assert "_generate_and_score_completions" not in vars(trainer)  # detached at the end


def test_grpo_samples_off_logs_none(tmp_path) -> None:
    producers = []

    def factory(*args, **kwargs):
        producers.append(RecordingProducer())
        return producers[-1]

    callback = RlpulseCallback(
        run="grpo-no-samples", config_dir=None, samples=False, producer_factory=factory
    )
    run_grpo(tmp_path, callback, steps=1)
    assert not any(NAME in data for _, data in producers[0].calls)


class FakeTrainer:
    """What ``SamplesHook`` touches of a GRPOTrainer on process ``rank`` of ``world``: TRL's
    ``_logs`` (deques of the generation batch's size, as TRL makes them), filled the way
    ``_generate_and_score_completions`` fills them, with every process's rows (gathered)."""

    def __init__(self, rank, world, n):
        self.accelerator = SimpleNamespace(num_processes=world, process_index=rank)
        self.reward_func_names = ["acc", "fmt"]
        self.model = SimpleNamespace(training=True)
        self.state = SimpleNamespace(global_step=9)
        self.reward_weights = torch.tensor([1.0, 2.0])
        size = world * n
        self._logs = {
            "images": deque(maxlen=size),
            "prompt": deque(maxlen=size),
            "completion": deque(maxlen=size),
            "rewards": defaultdict(lambda: deque(maxlen=size)),
            "advantages": deque(maxlen=size),
            "extra": defaultdict(lambda: deque(maxlen=size)),
        }
        self.generation = 0

    def _generate_and_score_completions(self, inputs):
        g, world, n = self.generation, self.accelerator.num_processes, len(inputs)
        self.generation += 1
        everyone = [(g, r, i) for r in range(world) for i in range(n)]  # gather_object's order
        self._logs["prompt"].extend(f"p{g}.{r}.{i}" for g, r, i in everyone)
        self._logs["completion"].extend(
            [{"role": "assistant", "content": f"c{g}.{r}.{i}"}] for g, r, i in everyone
        )
        self._logs["rewards"]["acc"].extend(float(r) for _, r, _ in everyone)
        self._logs["rewards"]["fmt"].extend(float("nan") if i == 0 else 1.0 for *_, i in everyone)
        self._logs["advantages"].extend(0.1 * i for *_, i in everyone)
        return {"local": [f"p{g}.{self.accelerator.process_index}.{i}" for i in range(n)]}


def test_each_process_logs_its_own_rows_of_trls_gathered_ones() -> None:
    world, n = 3, 2
    got = {}
    for rank in range(world):
        trainer, producer = FakeTrainer(rank, world, n), RecordingProducer()
        SamplesHook(producer).attach(trainer)
        trainer._generate_and_score_completions([{}] * n)  # generation 0
        out = trainer._generate_and_score_completions([{}] * n)  # generation 1
        assert out["local"] == [f"p1.{rank}.{i}" for i in range(n)]  # TRL's result, unchanged
        ((s0, _), (s1, d1)) = producer.calls
        assert s0 == s1 == 10  # global_step + 1: the step being computed
        rows = d1[NAME].rows
        assert [r["prompt"] for r in rows] == out["local"]  # this process's, this generation's
        got[rank] = list(rows)
    assert got[1] == [
        {
            "prompt": "p1.1.0",
            "response": "assistant: c1.1.0",
            "reward": 1.0,  # fmt gave none: acc's alone
            "advantage": 0.0,
            "rewards/acc": 1.0,
            "rewards/fmt": None,
        },
        {
            "prompt": "p1.1.1",
            "response": "assistant: c1.1.1",
            "reward": 3.0,  # 1.0 * 1 + 2.0 * 1
            "advantage": 0.1,
            "rewards/acc": 1.0,
            "rewards/fmt": 1.0,
        },
    ]
    every = [r["prompt"] for rank in range(world) for r in got[rank]]
    assert sorted(every) == sorted(f"p1.{r}.{i}" for r in range(world) for i in range(n))


def test_evaluation_is_not_logged_and_a_failure_never_reaches_the_step(caplog) -> None:
    trainer, producer = FakeTrainer(0, 1, 2), RecordingProducer()
    hook = SamplesHook(producer)
    detach = hook.attach(trainer)
    trainer.model.training = False
    trainer._generate_and_score_completions([{}] * 2)
    assert producer.calls == []
    trainer.model.training = True
    trainer.reward_func_names = ["acc", "fmt", "gone"]  # a column TRL did not fill
    with caplog.at_level(logging.WARNING, logger="rlpulse.integrations.trl"):
        for _ in range(2):
            assert trainer._generate_and_score_completions([{}] * 2)["local"]
    assert producer.calls == [] and hook.stats() == {"samples_logged": 0, "samples_failed": 2}
    assert len([r for r in caplog.records if "samples" in r.getMessage()]) == 1
    detach()
    assert "_generate_and_score_completions" not in vars(trainer)
    assert SamplesHook.fits(FakeTrainer(0, 1, 1)) and not SamplesHook.fits(SimpleNamespace())


def test_grpo_samples_reach_the_jsonl_record(tmp_path) -> None:
    if not samples_supported():
        pytest.skip(NO_SAMPLES)
    with jsonl_collector(tmp_path) as (collector, out):
        callback = RlpulseCallback(collector.address, run="grpo-samples", config_dir=None)
        _, given = run_grpo(tmp_path, callback, steps=2)
    got = records(out)
    for step, generation in zip((1, 2), given, strict=True):
        samples = got[step]["samples"][NAME]
        assert samples["key"] == "reward"
        rewards = [
            WEIGHTS[0] * a + WEIGHTS[1] * b
            for a, b in zip(generation["reward_length"], generation["reward_short"], strict=True)
        ]
        assert samples["top"][0]["reward"] == pytest.approx(max(rewards), abs=1e-6)
        assert samples["bottom"][0]["reward"] == pytest.approx(min(rewards), abs=1e-6)
        for row in samples["top"] + samples["bottom"] + samples["random"]:
            assert row["prompt"] in generation["prompts"]
            assert row["response"] in generation["completions"]
            assert row["role"] == "trl" and row["rank"] == 0
