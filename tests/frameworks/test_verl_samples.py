"""verl's validation generations as ``val/samples``: through verl's own
``_maybe_log_val_generations`` and ``ValidationGenerationsLogger``, to a recording producer and
to a real collector."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

pytest.importorskip(
    "verl", reason="verl is not installed: `make install-integrations` (.venv-integrations)"
)

from omegaconf import OmegaConf
from verl.utils.tracking import Tracking, ValidationGenerationsLogger

from rlpulse.producer import Samples
from rlpulse.producer.integrations import verl as rlpulse_verl
from rlpulse.producer.integrations.verl_samples import ValGenerations, val_rows
from rlpulse.schemas import metrics as M
from tests.frameworks.helpers import NO_SAMPLES, jsonl_collector, records, samples_supported
from tests.frameworks.verl_loss_job import stub_rollout_server_modules

stub_rollout_server_modules()  # ray_trainer's rollout server imports, unused here
from verl.trainer.ppo.ray_trainer import RayPPOTrainer  # noqa: E402

PROJECT, EXPERIMENT = "rlpulse-tests", "verl-val"
INPUTS = [f"question {i}" for i in range(6)]
OUTPUTS = [f"answer {i}" for i in range(6)]
SCORES = [0.5, -1.0, 2.0, 0.0, 1.5, -0.25]


@pytest.fixture
def registered():
    rlpulse_verl.register()
    yield
    rlpulse_verl.unregister()


class RecordingProducer:
    """A producer double: what the backend's producer was asked to log."""

    def __init__(self, *args, **kwargs):
        self.calls = []
        self.config = None

    def run_config(self, config):
        self.config = config
        return True

    def log(self, data, step):
        self.calls.append((step, dict(data)))

    def close(self):
        pass

    def stats(self):
        return {"unacked": 0, "dropped_send": 0}


class RaisingProducer(RecordingProducer):
    def log(self, data, step):
        raise RuntimeError("producer broke")


def backend(factory=RecordingProducer):
    config = {"trainer": {"rlpulse": {"config_dir": None}}}
    return rlpulse_verl.RlpulseBackend(PROJECT, EXPERIMENT, config, producer_factory=factory)


def validate(step: int, log_val_generations: int, logger=("console", "rlpulse")) -> None:
    """verl's own ``RayPPOTrainer._maybe_log_val_generations``, on what ``_validate`` has
    collected, for a trainer of this project and experiment at ``step``."""
    trainer = SimpleNamespace(
        config=OmegaConf.create(
            {"trainer": {"log_val_generations": log_val_generations, "logger": list(logger)}}
        ),
        validation_generations_logger=ValidationGenerationsLogger(PROJECT, EXPERIMENT),
        global_steps=step,
    )
    RayPPOTrainer._maybe_log_val_generations(trainer, INPUTS, OUTPUTS, SCORES)


def test_validation_generations_reach_the_driver_producer_as_samples(registered) -> None:
    b = backend()
    try:
        validate(step=4, log_val_generations=100)  # more than there are: all of them
        ((step, data),) = b.producer.calls
        assert step == 4 and set(data) == {M.VAL_SAMPLES.name}
        samples = data[M.VAL_SAMPLES.name]
        assert isinstance(samples, Samples) and samples.key == "score" and samples.k is None
        expected = {
            (f"question {i}", f"answer {i}", score) for i, score in enumerate(SCORES)
        }  # verl shuffles them; the rows are the same
        assert {(r["prompt"], r["response"], r["score"]) for r in samples.rows} == expected
        assert all(set(r) == {"prompt", "response", "score"} for r in samples.rows)

        validate(step=5, log_val_generations=2)  # verl's count: two of them
        assert len(b.producer.calls[-1][1][M.VAL_SAMPLES.name].rows) == 2
        validate(step=6, log_val_generations=0)  # verl's default: none collected, none logged
        validate(step=7, log_val_generations=100, logger=("console",))  # backend not named
        assert [s for s, _ in b.producer.calls] == [4, 5]
        assert b.stats()["val_samples_logged"] == 2
    finally:
        b.finish()
    assert ValGenerations.live == {}
    validate(step=8, log_val_generations=100)  # after finish: nothing to log to
    assert len(b.producer.calls) == 2


def test_a_failing_hook_never_reaches_verl_and_warns_once(registered, caplog, monkeypatch) -> None:
    b = backend(RaisingProducer)
    shown = []  # verl's own generations loggers still run after ours
    monkeypatch.setattr(
        ValidationGenerationsLogger,
        "log_generations_to_swanlab",
        lambda self, samples, step: shown.append((step, len(samples))),
    )
    try:
        with caplog.at_level(logging.WARNING, logger="rlpulse.integrations.verl"):
            validate(step=1, log_val_generations=100, logger=("swanlab", "rlpulse"))
            validate(step=2, log_val_generations=100)
            gens = ValGenerations.find(PROJECT, EXPERIMENT)
            gens.log([("only two fields", "x")], step=3)  # not verl's (input, output, score)
        assert b.stats()["val_samples_failed"] == 3 and b.stats()["val_samples_logged"] == 0
        warnings = [r for r in caplog.records if "validation generations" in r.getMessage()]
        assert len(warnings) == 1 and "producer broke" in warnings[0].getMessage()
        assert shown == [(1, len(SCORES))]
    finally:
        b.finish()


def test_unregister_restores_verls_generations_logger() -> None:
    shipped = ValidationGenerationsLogger.log
    rlpulse_verl.register()
    rlpulse_verl.register()  # idempotent
    try:
        assert ValidationGenerationsLogger.log is not shipped
    finally:
        rlpulse_verl.unregister()
    assert ValidationGenerationsLogger.log is shipped


def test_rows_keep_a_score_that_is_not_a_number_for_the_producer_to_drop() -> None:
    assert val_rows([("p", "r", 1), ("p", "r", "n/a")]) == [
        {"prompt": "p", "response": "r", "score": 1.0},
        {"prompt": "p", "response": "r", "score": "n/a"},
    ]


def test_validation_samples_reach_the_jsonl_record(tmp_path, registered) -> None:
    if not samples_supported():
        pytest.skip(NO_SAMPLES)
    with jsonl_collector(tmp_path) as (collector, out):
        config = {"trainer": {"rlpulse": {"address": collector.address, "config_dir": None}}}
        tracking = Tracking(PROJECT, EXPERIMENT, ["console", "rlpulse"], config=config)
        validate(step=3, log_val_generations=100)
        tracking.log(data={"val-core/test/reward/mean@1": 0.5}, step=3)  # as fit() does next
        tracking.finish()
    record = records(out)[3]
    samples = record["samples"][M.VAL_SAMPLES.name]
    assert samples["key"] == "score"
    top, bottom = samples["top"], samples["bottom"]
    assert top[0]["score"] == max(SCORES) and top[0]["prompt"] == "question 2"
    assert bottom[0]["score"] == min(SCORES) and bottom[0]["response"] == "answer 1"
    logged = {(f"question {i}", f"answer {i}", s) for i, s in enumerate(SCORES)}
    for row in top + bottom + samples["random"]:
        assert (row["prompt"], row["response"], row["score"]) in logged
        assert row["role"] == "driver" and row["rank"] == 0
