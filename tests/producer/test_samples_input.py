"""Bad ``Samples`` are warned about in the worker, as other bad values are (issue 45, item 3):
they were only counted in ``stats()``. And ``rows`` that are not a sequence of mappings (a
string, a single dict, a number, a list of tuples) are one invalid value, counted and warned,
instead of being iterated (``Samples("not a list")`` counted 10 dropped rows)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from rlpulse import Producer, Samples
from rlpulse.producer.config import ProducerConfig
from rlpulse.schemas import metrics as M
from rlpulse.schemas.samples import SampleLimits, clean_row, row_problem
from tests.producer.conftest import entries, has_bye

NAME = M.ROLLOUT_SAMPLES.name
NOT_ROWS = "Samples rows must be a sequence of mappings (one dict per row)"


def log_once(inbox, value: Any) -> tuple[Producer, list]:
    p = Producer(inbox.address, run="r", role="a", config=ProducerConfig(gpu_sample_s=0))
    p.log({NAME: value, "kept": 1.0}, step=0)
    p.close()
    return p, entries(inbox.receive(until=has_bye))


@pytest.mark.parametrize(
    "rows, what",
    [
        ("not a list", "got a str"),
        (b"bytes", "got a bytes"),
        ({"prompt": "2+2", "reward": 1.0}, "got a dict (one row? put it in a list)"),
        (5, "got a int"),
        (None, "got a NoneType"),
        (["a", "b"], "its rows are str"),
        ([("2+2", "4", 1.0)], "its rows are tuple"),
    ],
)
def test_rows_that_are_not_a_sequence_of_mappings_are_one_invalid_value(
    inbox, caplog, rows, what
) -> None:
    caplog.set_level(logging.WARNING, "rlpulse.producer")
    p, got = log_once(inbox, Samples(rows, key="reward"))
    (entry,) = got
    assert entry.names == ("kept",)
    stats = p.stats()
    assert (stats["invalid"], stats["samples_dropped"]) == (1, 0)
    assert f"{NAME}: {NOT_ROWS}, {what}; that value is dropped" in caplog.text


def test_bad_rows_among_good_ones_are_dropped_counted_and_warned_once(inbox, caplog) -> None:
    caplog.set_level(logging.WARNING, "rlpulse.producer")
    rows = [{"reward": 1.0}, {"reward": "high"}, {"text": "no reward"}, 7]
    p = Producer(inbox.address, run="r", role="a", config=ProducerConfig(gpu_sample_s=0))
    p.log({NAME: Samples(rows, key="reward")}, step=0)
    p.log({NAME: Samples(rows, key="reward")}, step=1)
    p.close()
    assert [e.names for e in entries(inbox.receive(until=has_bye))] == [(NAME,), (NAME,)]
    assert p.stats()["samples_dropped"] == 6 and p.stats()["invalid"] == 0
    warned = [r.getMessage() for r in caplog.records if "rows dropped" in r.getMessage()]
    assert len(warned) == 1, warned
    assert (
        f"{NAME}: 3 of 4 Samples rows dropped (the first: its 'reward' is not a number, got "
        "str); counted in stats()['samples_dropped']" in warned[0]
    )


@pytest.mark.parametrize(
    "value, why",
    [
        (Samples([{"r": 1.0}], key="r", k=0), "k must be an int from 1 to 1024, got 0"),
        (Samples([{"r": 1.0}], key=""), "key must be a non-empty string, got ''"),
        (Samples([{"r": 1.0}], key=3), "key must be a non-empty string, got 3"),  # type: ignore[arg-type]
    ],
)
def test_a_bad_k_or_key_is_warned_about(inbox, caplog, value, why) -> None:
    caplog.set_level(logging.WARNING, "rlpulse.producer")
    p, got = log_once(inbox, value)
    assert [e.names for e in got] == [("kept",)] and p.stats()["invalid"] == 1
    assert f"{NAME}: Samples {why}; that value is dropped" in caplog.text


@pytest.mark.parametrize(
    "row, problem",
    [
        (7, "not a mapping: int"),
        ({"reward": 1.0, **{f"f{i}": i for i in range(64)}}, "65 fields, more than 64"),
        ({"text": "x"}, "no 'reward'"),
        ({"reward": "high"}, "its 'reward' is not a number, got str"),
        ({"reward": float("inf")}, "its 'reward' is not finite (inf)"),
        ({"reward": 1.0, 3: "x"}, "a field name that is not a string: 3"),
        (
            {"reward": 1.0, "ids": [1, 2]},
            "field 'ids' is a list, not a string, number, boolean or None",
        ),
        ({"reward": 1.0, "n": 2**70}, "field 'n' is an int beyond 64 bits"),
    ],
)
def test_row_problem_names_why_clean_row_drops_a_row(row: Any, problem: str) -> None:
    limits = SampleLimits()
    assert clean_row(row, "reward", limits) is None
    assert row_problem(row, "reward", limits) == problem
    assert row_problem({"reward": 1.0, "text": "ok"}, "reward", limits) is None
