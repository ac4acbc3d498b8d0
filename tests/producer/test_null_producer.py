"""NullProducer swaps in for Producer with the same constructor arguments, and the producer
package exports load_curve (issue 17, item 6)."""

from __future__ import annotations

import inspect

import pytest

from rlpulse import producer
from rlpulse.producer import NullProducer, Producer
from rlpulse.producer.config import ProducerConfig
from rlpulse.wire.transport import load_curve


def test_takes_producers_arguments_as_they_are() -> None:
    args = ("tcp://127.0.0.1:5555",)
    kwargs = {"run": "r", "role": "actor_train", "rank": 1, "world_size": 2}
    kwargs["config"] = ProducerConfig(sndhwm=10)
    kwargs["expected_roles"] = {"actor_train": 2}
    kwargs["reductions"] = {"my/peak": "max"}
    with NullProducer(*args, **kwargs) as p:
        p.log({"actor/pg_loss": 0.1}, step=0)
        with p.phase("actor_train/train_step", step=0) as phase:
            phase.add({"rollout/response/longest": 3})  # kept nowhere, as Producer's
        assert set(p.stats().values()) == {0}


def test_its_signature_is_producers() -> None:
    null = inspect.signature(NullProducer)
    assert null.parameters == inspect.signature(Producer).parameters


def test_every_public_call_of_producer_is_there_alike() -> None:
    """A NullProducer swapped in anywhere a Producer runs (the demo trainer with
    ``metrics=false``) must take every call: ``run_config`` was missing, and the trainer's
    ``metrics=false`` run died at its first line of rlpulse."""
    public = {n for n in dir(Producer) if not n.startswith("_")}
    assert public <= set(dir(NullProducer))
    for name in public:
        real, null = getattr(Producer, name), getattr(NullProducer, name)
        if callable(real):
            params = inspect.signature(null).parameters
            assert params == inspect.signature(real).parameters, name
    p = NullProducer(run="r", role="driver")
    assert p.run_config({"lr": 1e-3}) is False and p.recorded_run == "r"


def test_refuses_what_producer_refuses() -> None:
    with pytest.raises(TypeError, match="bogus"):
        NullProducer(run="r", role="a", bogus=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        NullProducer("tcp://127.0.0.1:5555", "r")  # type: ignore[misc]
    NullProducer()  # type: ignore[call-arg]  # nothing is sent: every argument may be left out


def test_load_curve_is_exported() -> None:
    assert producer.load_curve is load_curve
    assert "load_curve" in producer.__all__
