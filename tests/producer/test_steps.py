"""Any integer is a step (issue 45, item 2): ``step=np.int64(3)`` or ``torch.tensor(4)`` dropped
the whole call, so ``for step in np.arange(n)`` logged nothing. Numpy integers, 0-d integer
arrays and CPU tensors, anything with ``__index__`` now go through ``log()``, ``phase()``,
``step_done()`` and the integrations' helpers as the int they hold; floats, bools, strings,
arrays of more dimensions and tensors on a GPU stay refused, counted and warned about once."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
import torch

from rlpulse.producer import Producer, Samples
from rlpulse.producer.config import ProducerConfig
from rlpulse.producer.integrations.driver import DriverStream
from rlpulse.producer.integrations.verl_samples import ValGenerations
from rlpulse.producer.steps import BadStep, as_step
from rlpulse.schemas import metrics as M
from rlpulse.schemas.messages import MAX_STEP
from tests.producer.conftest import done_steps, entries, has_bye


class Counter:
    """A step counter of the user's own, an integer by ``__index__``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __index__(self) -> int:
        return self.n


INTEGRAL = [
    (np.int64(3), 3),
    (np.int32(4), 4),
    (np.uint8(5), 5),
    (np.array(6), 6),
    (torch.tensor(7), 7),
    (torch.tensor(8, dtype=torch.int32), 8),
    (Counter(9), 9),
    (np.uint64(MAX_STEP), MAX_STEP),
]
REFUSED = [
    3.0,
    np.float64(3.0),
    True,
    np.True_,
    np.array(True),
    torch.tensor(True),
    "3",
    None,
    np.array([3]),
    torch.tensor([3]),
    torch.tensor(3.0),
    torch.tensor(3, device="meta"),  # not on the CPU: its value is not the host's to read
    -1,
    np.int64(-1),
    MAX_STEP + 1,
    np.uint64(2**63),
]


@pytest.mark.parametrize("value, want", INTEGRAL)
def test_as_step_takes_any_integer_as_the_int_it_holds(value: Any, want: int) -> None:
    step = as_step(value)
    assert type(step) is int and step == want


@pytest.mark.parametrize("value", REFUSED, ids=repr)
def test_as_step_refuses_floats_bools_strings_arrays_and_device_tensors(value: Any) -> None:
    with pytest.raises(BadStep, match="step must be an integer from 0 to"):
        as_step(value)


def test_a_tensor_on_a_device_is_refused_with_the_fix_in_the_message() -> None:
    with pytest.raises(BadStep, match=r"on meta: reading its value .* pass an int"):
        as_step(torch.tensor(3, device="meta"))


def test_log_takes_numpy_and_tensor_steps(inbox) -> None:
    p = Producer(inbox.address, run="r", role="a", config=ProducerConfig(gpu_sample_s=0))
    for step in np.arange(3):  # numpy's int64 steps
        p.log({"x": float(step)}, step=step)
    p.log({"x": 3.0}, step=torch.tensor(3))
    p.log({"x": 4.0}, step=np.array(4))
    p.close()
    got = entries(inbox.receive(until=has_bye))
    assert [e.step for e in got] == [0, 1, 2, 3, 4]
    assert [e.values[0][0] for e in got] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert p.stats()["invalid"] == 0 and p.stats()["logged"] == 5


def test_phase_and_step_done_take_them_too(inbox) -> None:
    p = Producer(inbox.address, run="r", role="a", config=ProducerConfig(gpu_sample_s=0))
    with p.phase("actor_train/train_step", step=np.int64(2)):
        pass
    p.step_done(np.int64(5))
    p.close()
    msgs = inbox.receive(until=has_bye)
    assert {e.step for e in entries(msgs)} == {2}
    assert 5 in done_steps(msgs)
    assert p.stats()["invalid"] == 0


@pytest.mark.parametrize("value", REFUSED, ids=repr)
def test_log_drops_a_call_with_a_bad_step_counts_and_warns(inbox, caplog, value) -> None:
    caplog.set_level(logging.WARNING, "rlpulse.producer")
    p = Producer(inbox.address, run="r", role="a", config=ProducerConfig(gpu_sample_s=0))
    p.log({"x": 1.0}, step=value)
    p.step_done(value)
    p.log({"x": 2.0}, step=1)
    p.close()
    (entry,) = entries(inbox.receive(until=has_bye))
    assert entry.step == 1 and p.stats()["invalid"] == 2
    assert "step must be an integer from 0 to" in caplog.text and "call dropped" in caplog.text


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, dict[str, Any]]] = []

    def log(self, data: dict[str, Any], step: int) -> None:
        self.calls.append((step, dict(data)))


def test_the_driver_stream_takes_integers_and_refuses_the_rest(caplog) -> None:
    rec = Recorder()
    stream = DriverStream(rec)
    stream.log({"loss": 1.0}, step=torch.tensor(2))
    stream.log({"loss": 1.0}, step=np.int64(3))
    with caplog.at_level(logging.WARNING, logger="rlpulse.integrations"):
        stream.log({"loss": 1.0}, step=2.5)  # type: ignore[arg-type]
        stream.log({"loss": 1.0}, step=True)
    assert [(type(step), step) for step, _ in rec.calls] == [(int, 2), (int, 3)]
    assert "step must be an integer from 0 to" in caplog.text and "2.5" in caplog.text


def test_validation_generations_refuse_a_float_step_instead_of_truncating_it(caplog) -> None:
    """verl's generations logger passed ``int(step)``: 2.7 became step 2, silently."""
    rec = Recorder()
    gens = ValGenerations(rec)
    gens.log([("2+2=", "4", 1.0)], step=np.int64(4))
    with caplog.at_level(logging.WARNING, logger="rlpulse.integrations.verl"):
        gens.log([("2+2=", "4", 1.0)], step=2.7)  # type: ignore[arg-type]
    ((step, data),) = rec.calls
    assert type(step) is int and step == 4
    assert isinstance(data[M.VAL_SAMPLES.name], Samples)
    assert gens.stats() == {"val_samples_logged": 1, "val_samples_failed": 1}
    assert "step must be an integer from 0 to" in caplog.text
