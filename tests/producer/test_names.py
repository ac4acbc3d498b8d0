"""The name table resolves each name once; a name one or two letters off a catalog name is
logged under its own name and warned about once (``rlpulse.producer.names``)."""

from __future__ import annotations

import logging

import pytest

from rlpulse.producer import Producer
from rlpulse.producer.config import ProducerConfig
from rlpulse.producer.encode import Encoder
from rlpulse.producer.stats import Counters
from rlpulse.schemas import metrics as M
from rlpulse.schemas.metrics import CATALOG
from rlpulse.schemas.reductions import Reduction
from tests.producer.conftest import entries, has_bye


class Warnings:
    """Every ``warn_once`` call, not deduplicated: what the name table asked for."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def __call__(self, key: str, message: str) -> None:
        self.calls.append((key, message))

    def near(self) -> list[str]:
        return [message for key, message in self.calls if key.startswith("near:")]


def test_a_near_miss_is_logged_under_its_own_name_and_warned_about_once() -> None:
    warn = Warnings()
    e = Encoder(CATALOG, {}, Counters(), warn)
    typo = "actor/pg_los"
    assert M.ACTOR_PG_LOSS.name == "actor/pg_loss"
    for step in range(5):  # step after step: the name is resolved, and checked, once
        assert e.entry(step, 0.0, {typo: 0.5, M.ACTOR_LR.name: 1e-5}) is not None
    (message,) = warn.near()
    assert repr(typo) in message and repr(M.ACTOR_PG_LOSS.name) in message
    (table,) = e.tables
    assert typo in table.names  # the user's own name, a new metric
    assert e.names.codes[typo] == int(Reduction.MEAN)


@pytest.mark.parametrize("name", ["my/own_metric", "actor/pg_loss_raw_total", "x", "loss"])
def test_a_genuinely_new_name_does_not_warn(name: str) -> None:
    warn = Warnings()
    e = Encoder(CATALOG, {}, Counters(), warn)
    e.entry(0, 0.0, {name: 1.0})
    assert warn.near() == []


def test_catalog_names_and_declared_names_do_not_warn() -> None:
    warn = Warnings()
    e = Encoder(CATALOG, {"actor/pg_los": Reduction.MAX}, Counters(), warn)
    e.entry(0, 0.0, {M.ACTOR_PG_LOSS.name: 1.0, "critic/score/mean": 2.0, "actor/pg_los": 3.0})
    assert warn.near() == []  # declared: the user said it is meant


def test_the_producer_warns_once_across_steps(inbox, caplog) -> None:
    caplog.set_level(logging.WARNING, "rlpulse.producer")
    p = Producer(inbox.address, run="r", role="a", config=ProducerConfig(gpu_sample_s=0))
    for step in range(4):
        p.log({"critic/advantagse": 0.5}, step=step)
    p.close()
    sent = entries(inbox.receive(until=has_bye))
    assert {name for entry in sent for name in entry.names} == {"critic/advantagse"}
    near = [r for r in caplog.records if "resembles" in r.getMessage()]
    assert len(near) == 1 and "'critic/advantages'" in near[0].getMessage()
