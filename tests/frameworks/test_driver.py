"""The driver value policy (``rlpulse.producer.integrations.driver``), with a recording producer and
then through a real collector: one sample per name and step reads back bit for bit, whatever
the catalog's reduction. Needs neither verl nor TRL."""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import pytest
import yaml

from rlpulse.producer import Producer
from rlpulse.producer.integrations.driver import DriverStream, as_number, save_run_config
from rlpulse.schemas import metrics as M
from rlpulse.schemas.errors import ConfigError
from rlpulse.schemas.reductions import Stat
from tests.frameworks.helpers import ROOT, jsonl_collector, records

SCORE = M.CRITIC_SCORE.output_names()


class Recorder:
    """Stands in for a Producer: keeps every ``log()`` call."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[int, dict[str, Any]]] = []
        self.fail = fail

    def log(self, data: dict[str, Any], step: int) -> None:
        if self.fail:
            raise RuntimeError("producer bug")
        self.calls.append((step, dict(data)))


def test_numbers_of_every_kind_become_one_float_sample() -> None:
    torch = pytest.importorskip("torch")
    for value, want in [
        (3, 3.0),
        (True, 1.0),
        (np.float32(0.5), 0.5),
        (np.int64(7), 7.0),
        (np.array(2.5), 2.5),
        (np.array([4.0]), 4.0),
        (torch.tensor(1.5), 1.5),
        (torch.tensor([[2.0]]), 2.0),
    ]:
        got = as_number(value)
        assert type(got) is float and got == want, value
    for value in ["text", None, [1.0, 2.0], np.zeros(3), torch.zeros(2), {"a": 1}, np.array("x")]:
        assert as_number(value) is None, value


def test_a_repeated_name_keeps_the_first_value_and_is_counted(caplog) -> None:
    rec = Recorder()
    stream = DriverStream(rec)
    with caplog.at_level(logging.WARNING, logger="rlpulse.integrations"):
        stream.log({"epoch": 0.5, "loss": 1.0}, step=3)
        stream.log({"epoch": 0.5, "train_runtime": 9.0}, step=3)  # same value: ignored
        stream.log({"loss": 2.0}, step=3)  # another value: dropped, counted, warned once
        stream.log({"loss": 3.0}, step=3)
        stream.log({"loss": 4.0, "epoch": 0.75}, step=np.int64(4))  # a new step starts afresh
    assert rec.calls == [
        (3, {"epoch": 0.5, "loss": 1.0}),
        (3, {"train_runtime": 9.0}),
        (4, {"loss": 4.0, "epoch": 0.75}),
    ]
    assert type(rec.calls[-1][0]) is int
    assert stream.stats() == {
        "sent": 5,
        "not_numeric": 0,
        "repeated": 2,
        "worker_side": 0,
        "derived": 0,
    }
    assert sum("loss logged twice at step 3" in r.getMessage() for r in caplog.records) == 1


def test_worker_side_families_and_non_numbers_are_left_out() -> None:
    rec = Recorder()
    stream = DriverStream(rec, worker_side=[M.CRITIC_ADVANTAGES.name, "actor/pg_clipfrac"])
    stream.log(
        {
            "critic/advantages/mean": 0.1,
            "critic/advantages/max": 2.0,
            "critic/advantages/min": -2.0,
            "actor/pg_clipfrac": 0.2,
            "critic/score/mean": 0.7,
            "val/generations": "a table",
            "nothing": None,
        },
        step=1,
    )
    assert rec.calls == [(1, {"critic/score/mean": 0.7})]
    assert stream.stats() == {
        "sent": 1,
        "not_numeric": 2,
        "repeated": 0,
        "worker_side": 4,
        "derived": 0,
    }


def test_names_the_collector_derives_are_left_out() -> None:
    """ROLL's driver logs system/samples (step x batch size) and system/tps: the collector
    computes both from every rank and would refuse them (counted as dropped_names)."""
    rec = Recorder()
    stream = DriverStream(rec)
    stream.log(
        {M.SYSTEM_SAMPLES.name: 512.0, M.SYSTEM_TPS.name: 3e4, "critic/score/mean": 0.7},
        step=2,
    )
    assert rec.calls == [(2, {"critic/score/mean": 0.7})]
    assert stream.stats()["derived"] == 2


def test_a_failing_producer_never_reaches_the_caller(caplog) -> None:
    stream = DriverStream(Recorder(fail=True))
    with caplog.at_level(logging.WARNING, logger="rlpulse.integrations"):
        stream.log({"loss": 1.0}, step=1)
        stream.log({"loss": 1.0}, step="not a step")  # type: ignore[arg-type]
    assert any("producer bug" in r.getMessage() for r in caplog.records)


def test_config_is_saved_as_plain_yaml(tmp_path) -> None:
    path = save_run_config(
        tmp_path / "runs" / "r1", {"a": {"b": (1, 2)}, "p": tmp_path, "f": np.float32(0.5)}, "x"
    )
    assert yaml.safe_load(path.read_text()) == {"a": {"b": [1, 2]}, "p": str(tmp_path), "f": 0.5}
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError) as err:
        save_run_config(tmp_path / "file" / "sub", {}, "rlpulse.trainer.rlpulse.config_dir")
    assert err.value.field == "rlpulse.trainer.rlpulse.config_dir"


def test_driver_values_read_back_exactly_whatever_the_catalog_declares(tmp_path) -> None:
    """Catalog means, fractions, maxima, last values and undeclared names: one sample each."""
    steps = {
        1: {
            SCORE[Stat.MEAN]: 0.1 + 0.2,
            SCORE[Stat.MAX]: 1.0 / 3.0,
            M.ACTOR_PG_CLIPFRAC_LOWER.name: 0.012345678901234567,  # a FRACTION entry
            M.ACTOR_LR.name: 1e-6,  # LAST
            M.ACTOR_PG_LOSS.name: -0.1828,  # MEAN
            "timing_s/gen": math.pi,  # outside the catalog
        },
        2: {SCORE[Stat.MEAN]: 2.0 / 7.0, "timing_s/gen": math.e, M.ACTOR_LR.name: 5e-7},
    }
    with jsonl_collector(tmp_path) as (collector, out):
        producer = Producer(collector.address, run="driver-exact", role="driver")
        stream = DriverStream(producer)
        for step, data in steps.items():
            stream.log(data, step)
        producer.close()
        assert producer.stats()["unacked"] == 0
    got = records(out)
    assert sorted(got) == [1, 2]
    for step, data in steps.items():
        assert got[step]["run"] == "driver-exact" and not got[step]["partial"]
        assert {k: got[step]["metrics"][k] for k in data} == data  # ==, not approx


@pytest.mark.parametrize("framework", ["verl", "trl"])
def test_example_collector_configs_load(framework) -> None:
    from rlpulse.collector.config import CollectorConfig

    text = (ROOT / "examples" / framework / "collector.yaml").read_text()
    config = CollectorConfig.from_mapping(yaml.safe_load(text))
    assert config.to_mapping()["track_with"] == ["stdout", "jsonl"]
