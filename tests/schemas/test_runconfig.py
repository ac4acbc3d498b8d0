"""A run's config as plain data (``rlpulse.schemas.runconfig``): what a framework's config
becomes, what is left out and named, and what the collector refuses."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np
import pytest

from rlpulse.schemas import runconfig
from rlpulse.schemas.errors import SchemaError


class Agg(enum.Enum):
    TOKEN = "token-mean"


@dataclass
class Model:
    path: Path
    dtype: object


def test_a_frameworks_config_becomes_plain_data_and_what_is_not_is_named() -> None:
    config = {
        "exp_name": "grpo",
        "loss_agg_mode": Agg.TOKEN,
        "actor_train": {
            "model": Model(Path("/m/qwen"), np.dtype("float32")),
            "lr": np.float32(0.5),
        },
        "steps": np.int64(7),
        "flags": (True, None, {1, 2}),
        "scores": [1, float("nan")],
        3: "int key",
        "callback": print,
        "nested": {"object": object(), "ok": 1},
        "tensor": np.zeros(3),
        "huge": 2**70,
    }
    cleaned = runconfig.clean(config)
    v = cleaned.values
    assert v["loss_agg_mode"] == "token-mean" and v["steps"] == 7 and type(v["steps"]) is int
    assert v["actor_train"] == {"model": {"path": "/m/qwen", "dtype": "float32"}, "lr": 0.5}
    assert v["flags"] == [True, None, [1, 2]] and v["3"] == "int key"
    assert math.isnan(v["scores"][1]) and v["huge"] == str(2**70)
    assert cleaned.left_out == ("callback", "nested.object", "tensor")
    assert v["nested"] == {"ok": 1}
    back = runconfig.decode(runconfig.encode(v))
    assert back["actor_train"] == v["actor_train"] and back["3"] == "int key"


def test_what_lies_too_deep_is_left_out_and_a_cycle_ends() -> None:
    cycle: dict = {}
    cycle["self"] = cycle
    cleaned = runconfig.clean({"loop": cycle})
    assert len(cleaned.left_out) == 1 and cleaned.left_out[0].startswith("loop.self.self")
    runconfig.decode(runconfig.encode(cleaned.values))  # what is kept the collector accepts


def test_a_mapping_that_raises_when_read_is_left_out() -> None:
    class Broken(dict):
        def items(self):  # an unresolvable interpolation, say
            raise KeyError("missing")

    cleaned = runconfig.clean({"a": 1, "b": Broken()})
    assert cleaned.values == {"a": 1, "b": {}} and cleaned.left_out == ("b",)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"\x00" * (runconfig.MAX_BYTES + 1), "bytes"),
        (b"\xc1", "not msgpack"),
        (msgspec.msgpack.encode([1, 2]), "a map"),
        (msgspec.msgpack.encode({1: "a"}), "no string"),
        (msgspec.msgpack.encode({"a": msgspec.msgpack.Ext(1, b"x")}), "no plain data"),
        (msgspec.msgpack.encode({"a": b"raw"}), "no plain data"),
        (None, "deeper"),
    ],
)
def test_the_collector_refuses_what_is_no_config(data: bytes | None, why: str) -> None:
    if data is None:  # nested deeper than MAX_DEPTH
        value: dict = {}
        for _ in range(runconfig.MAX_DEPTH + 1):
            value = {"a": value}
        data = msgspec.msgpack.encode(value)
    with pytest.raises(SchemaError, match=why) as err:
        runconfig.decode(data)
    assert err.value.reason == "bad_config"


def test_flat_keys_for_tensorboards_hparams() -> None:
    assert runconfig.flat({"a": {"b": {"c": 1}}, "l": [1, "x"], "n": None, "t": True}) == {
        "a.b.c": 1,
        "l": '[1, "x"]',
        "n": "null",
        "t": True,
    }


def test_largest_parts_are_named() -> None:
    values = {"small": 1, "big": "x" * 1000, "mid": "y" * 100}
    assert [k for k, _ in runconfig.largest(values, 2)] == ["big", "mid"]


def test_a_hello_with_a_config_reads_in_a_decoder_that_predates_it_and_back() -> None:
    """``Hello.config`` is an optional last field (PROTOCOL.md, Versioning): a collector that
    predates it reads the hello as before; a hello that predates it reads as one without."""
    from rlpulse.schemas import protocol

    class OldHello(msgspec.Struct, array_like=True, frozen=True, tag=21):
        producer: int
        seq: int
        run: str
        role: str
        rank: int
        world_size: int
        host: str
        pid: int
        expected: dict = {}
        tables: list = []
        metrics_url: str = ""
        logs: bool = True
        resume: bool = False

    config = runconfig.encode({"lr": 1e-6})
    new = protocol.encode_hello(7, 1, run="r", role="driver", rank=0, world_size=1, config=config)
    old = msgspec.msgpack.decode(new, type=OldHello)
    assert (old.run, old.role, old.resume) == ("r", "driver", False)
    back = protocol.decode(msgspec.msgpack.encode(old))
    assert isinstance(back, protocol.Hello) and back.config == b""
    assert protocol.decode(new).config == config  # type: ignore[union-attr]
