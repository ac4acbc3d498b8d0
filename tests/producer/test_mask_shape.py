"""A mask must have its values' shape (issue 45, item 1): a transposed ``[T, B]`` mask of as
many elements as the ``[B, T]`` values was accepted (compared by element count) and gave a wrong
number, counted as valid. Every path a masked value can take refuses it now, counts it
(``invalid``) and warns once naming both shapes: reduced at once, copied and reduced by the
sender (one by one or a call's alike tensors together), a distribution's sketch, torch dtypes
numpy cannot view, and the GPU pipeline (on the fake device: the check reads shapes, host
metadata, and dispatches nothing that would wait for a GPU)."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest
import torch

from rlpulse.producer import Masked, Producer
from rlpulse.producer.config import ProducerConfig
from rlpulse.producer.copies import snapshot_value
from rlpulse.producer.reduce import InvalidValue, reduce_value
from rlpulse.producer.sketch import sketch_value
from rlpulse.schemas import metrics as M
from tests.producer.conftest import entries, has_bye
from tests.producer.fakedevice import SYNCING_OPS, Recorder, fake_context

DIST = M.CRITIC_ADVANTAGES.name  # a distribution metric: the sketch path
SHAPES = {"small": (2, 3), "large": (16, 40)}  # reduced in log(); copied for the sender


def transposed(kind: str, size: str) -> Masked:
    """Values of shape (B, T) with a mask of shape (T, B): as many elements, wrong layout."""
    b, t = SHAPES[size]
    values = np.arange(b * t, dtype=np.float64).reshape(b, t)
    mask = (np.arange(b * t) % 2 == 0).reshape(t, b)
    if kind == "numpy":
        return Masked(values, mask)
    if kind == "list":
        return Masked(values.tolist(), mask.tolist())
    if kind == "torch":
        return Masked(torch.from_numpy(values), torch.from_numpy(mask))
    if kind == "bfloat16":  # numpy cannot view it: torch reduces it where it lives
        return Masked(torch.from_numpy(values).to(torch.bfloat16), torch.from_numpy(mask))
    if kind == "numpy+tensor-mask":
        return Masked(values, torch.from_numpy(mask))
    raise AssertionError(kind)


KINDS = ["numpy", "list", "torch", "bfloat16", "numpy+tensor-mask"]


@pytest.mark.parametrize("size", sorted(SHAPES))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["plain", DIST])
def test_log_refuses_a_transposed_mask_counts_and_warns(inbox, caplog, kind, size, name) -> None:
    caplog.set_level(logging.WARNING, "rlpulse.producer")
    p = Producer(inbox.address, run="r", role="a", config=ProducerConfig(gpu_sample_s=0))
    p.log({name: transposed(kind, size), "kept": 1.0}, step=0)
    p.close()
    (entry,) = entries(inbox.receive(until=has_bye))
    assert entry.names == ("kept",)
    assert p.stats()["invalid"] == 1
    b, t = SHAPES[size]
    assert f"{name}: mask has shape ({t}, {b}) but values have shape ({b}, {t})" in caplog.text


def test_alike_tensors_sharing_a_transposed_mask_are_each_refused(inbox, caplog) -> None:
    """A call's per-token tensors sharing one mask are copied together (``snapshot_rows``);
    with a transposed mask each of them is refused, and the call's other values still go."""
    caplog.set_level(logging.WARNING, "rlpulse.producer")
    mask = torch.ones(64, 8, dtype=torch.bool)
    data = {f"t{i}": Masked(torch.randn(8, 64), mask) for i in range(4)}
    p = Producer(inbox.address, run="r", role="a", config=ProducerConfig(gpu_sample_s=0))
    p.log({**data, "kept": 2.0}, step=0)
    p.close()
    (entry,) = entries(inbox.receive(until=has_bye))
    assert entry.names == ("kept",)
    assert p.stats()["invalid"] == 4
    assert "t3: mask has shape (64, 8) but values have shape (8, 64)" in caplog.text


@pytest.mark.parametrize("name", ["plain", DIST])
def test_the_gpu_pipeline_refuses_it_without_waiting_for_the_device(inbox, caplog, name) -> None:
    caplog.set_level(logging.WARNING, "rlpulse.producer")
    device, _ = fake_context()
    p = Producer(
        inbox.address, run="r", role="a", device=device, config=ProducerConfig(gpu_sample_s=0)
    )
    rec = Recorder()
    with rec:
        p.log(
            {
                name: Masked(torch.randn(4, 6), torch.ones(6, 4)),
                "host mask": Masked(torch.randn(4, 6), np.ones((6, 4))),
                "kept": torch.tensor(3.0),
            },
            step=0,
        )
    p.close()
    assert not SYNCING_OPS & set(rec.ops), rec.ops
    (entry,) = entries(inbox.receive(until=has_bye))
    assert entry.names == ("kept",)
    assert p.stats()["invalid"] == 2
    assert f"{name}: mask has shape (6, 4) but values have shape (4, 6)" in caplog.text
    assert device.outstanding() == 0


@pytest.mark.parametrize(
    "values, mask",
    [
        (np.ones((2, 3)), np.ones(6)),  # flattened: same count, not the same shape
        (np.ones(6), np.ones((2, 3))),
        (np.ones((2, 3)), np.ones((2, 1))),  # broadcasts by numpy's rules: refused all the same
        (np.ones((3, 3)), np.ones(3)),  # broadcasts along the wrong axis when B == T
        (torch.ones(2, 3), torch.ones(6)),
        (torch.ones(2, 3), torch.ones(2, 1)),
    ],
)
def test_a_mask_of_another_shape_is_refused_even_where_numpy_would_broadcast(values, mask) -> None:
    for reduce in (reduce_value, sketch_value):
        with pytest.raises(InvalidValue, match="mask has shape"):
            reduce(Masked(values, mask))


@pytest.mark.parametrize("mask_shape", [(300, 2), (600,), (2, 1)])
def test_host_copies_refuse_it_before_copying(mask_shape) -> None:
    """Arrays of at least ``COPY_MIN`` samples are copied for the sender, flat: the shapes are
    compared before."""
    with pytest.raises(InvalidValue, match=re.escape(f"mask has shape {mask_shape} but")):
        snapshot_value(Masked(np.ones((2, 300)), np.ones(mask_shape)))


def test_a_mask_of_the_values_shape_still_selects_exactly() -> None:
    values = np.arange(6.0).reshape(2, 3)
    mask = np.array([[True, False, True], [False, False, True]])
    state = reduce_value(Masked(values, mask)).state
    assert (state.sum, state.weight, state.min, state.max) == (7.0, 3.0, 0.0, 5.0)
    tensor = reduce_value(Masked(torch.from_numpy(values), torch.from_numpy(mask))).state
    assert tensor == state
