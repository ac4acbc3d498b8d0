"""``Samples`` values in the producer: reduced on the sender thread (never in ``log()``), sent
as a row count beside their state; bad rows dropped and counted, bad values counted, the
config checked."""

from __future__ import annotations

import struct

import pytest

from rlpulse import Samples
from rlpulse.producer.config import ProducerConfig
from rlpulse.producer.encode import Encoder
from rlpulse.producer.samples import SampleReducer
from rlpulse.schemas import Reduction, metrics as M, protocol
from rlpulse.schemas.errors import ConfigError
from rlpulse.schemas.metrics import CATALOG
from rlpulse.schemas.samples import SampleLimits, SampleState, decode

NAME = M.ROLLOUT_SAMPLES.name


def encoder(k: int = 2, field_bytes: int = 64) -> Encoder:
    reducer = SampleReducer(("actor", 3), SampleLimits(k=k, field_bytes=field_bytes))
    return Encoder(CATALOG, {}, reducer.counters, lambda key, msg: None, samples=reducer)


def test_a_samples_value_is_a_sum_row_of_its_rows_with_its_state_beside_it() -> None:
    enc = encoder()
    rows = [{"reward": float(i), "text": "t"} for i in range(5)]
    entry = enc.entry(
        7, 1.0, {NAME: Samples(rows, key="reward"), "x": 1.0, "u/gen": Samples(rows[:1], "reward")}
    )
    assert entry is not None
    step, _, table, values, _, _, samples = entry
    assert step == 7 and values[:8] == struct.pack("<d", 5.0)  # the row counts the rows
    decl = enc.tables[table]
    assert decl.names == [NAME, "x", "u/gen"]
    assert decl.kinds[0] == decl.kinds[2] == Reduction.SUM  # a user's name too
    state = decode(samples[0])
    assert (state.rows, state.k) == (5, 2)
    assert [r.fields["reward"] for r in state.top] == [4.0, 3.0]
    assert {(r.role, r.rank) for r in state.random} == {("actor", 3)}
    assert decode(samples[2]).rows == 1
    msg = protocol.decode(protocol.encode_metrics(1, 1, [entry]))
    assert [(e, r) for e, r, _ in msg.samples] == [(0, 0), (0, 2)]  # type: ignore[union-attr]
    assert protocol.packed_bytes(entry) >= len(protocol.encode_metrics(1, 1, [entry]))


def test_bad_rows_are_dropped_and_counted_long_texts_cut_bad_values_counted() -> None:
    enc = encoder(field_bytes=32)
    rows = [{"reward": 1.0, "text": "y" * 100}, {"reward": "no"}, {"reward": float("nan")}, 5]
    entry = enc.entry(0, 0.0, {NAME: Samples(rows, key="reward")})
    assert entry is not None
    state = decode(entry[6][0])
    assert (state.rows, state.dropped, state.cut) == (1, 3, 1)
    assert "[cut" in state.top[0].fields["text"]  # type: ignore[operator]
    c = enc.counters
    assert (c.samples_dropped, c.samples_cut, c.invalid) == (3, 1, 0)
    assert enc.entry(0, 0.0, {NAME: Samples(rows, key="reward", k=0)}) is None
    assert enc.entry(0, 0.0, {NAME: Samples(rows, key=3)}) is None  # type: ignore[arg-type]
    assert c.invalid == 2


def test_a_row_mapping_that_raises_costs_the_value_never_the_caller() -> None:
    class Hostile(dict):
        def items(self):  # type: ignore[override]
            raise RuntimeError("boom")

    enc = encoder()
    assert enc.entry(0, 0.0, {NAME: Samples([Hostile(reward=1.0)], key="reward")}) is None
    assert enc.counters.invalid == 1


def test_log_hands_samples_and_reduced_states_to_the_sender(inbox) -> None:
    """``log()`` copies no row: Samples (within the pending bound) and a state reduced already
    (``reduce_then_fill``) reach the sender as they are, and both arrive reduced."""
    from rlpulse.producer import Producer
    from rlpulse.producer.encode import PASSED
    from rlpulse.producer.samples import reduce_then_fill
    from tests.producer.conftest import has_bye

    assert SampleState in PASSED
    state = reduce_then_fill(
        [{"score": float(i)} for i in range(5)],
        "score",
        lambda idx: [{"text": f"row {i}"} for i in idx],
        origin=("driver", 0),
        limits=SampleLimits(k=2),
    )
    p = Producer(inbox.address, run="r", role="actor")
    p.log({NAME: Samples([{"score": 2.0}, {"score": 1.0}], key="score")}, step=1)
    p.log({NAME: state}, step=2)
    p.close()
    stats = p.stats()
    messages = inbox.receive(until=has_bye)
    blobs = [b for m in messages if isinstance(m, protocol.Metrics) for *_, b in m.samples]
    assert [decode(b).rows for b in blobs] == [2, 5]
    assert stats["invalid"] == 0 and stats["dropped_unreduced"] == 0


@pytest.mark.parametrize(
    ("field", "value"),
    [("samples_k", 0), ("samples_k", 1025), ("samples_field_bytes", 8), ("samples_row_fields", 0)],
)
def test_bad_samples_config_fails_naming_the_field(field: str, value: int) -> None:
    with pytest.raises(ConfigError, match=field):
        ProducerConfig(**{field: value})
    assert ProducerConfig(samples_k=3).sample_limits() == SampleLimits(k=3)


def test_reduce_then_fill_is_the_state_of_the_filled_rows_filling_only_those_kept() -> None:
    """Given the same random keys, the state equals reducing the completed rows; ``fill`` is
    asked for at most 3 k rows (here 3 x 4 of 500)."""
    import random

    from rlpulse.producer.samples import reduce_then_fill
    from rlpulse.schemas.samples import reduce_rows

    rng = random.Random(5)
    numbers = [{"score": float(rng.randint(0, 20)), "length": i % 7} for i in range(500)]
    texts = {i: f"response {i} " + "z" * (i % 3) * 40 for i in range(500)}
    asked: list[int] = []

    def fill(indices: list[int]) -> list[dict[str, str]]:
        asked.extend(indices)
        return [{"response": texts[i]} for i in indices]

    limits = SampleLimits(k=4, field_bytes=64)
    seeds = [random.Random(9), random.Random(9)]
    got = reduce_then_fill(
        numbers,
        "score",
        fill,
        origin=("driver", 0),
        limits=limits,
        keys=lambda: seeds[0].getrandbits(63),
    )
    full = [{**row, "response": texts[i]} for i, row in enumerate(numbers)]
    want = reduce_rows(
        full, "score", origin=("driver", 0), limits=limits, keys=lambda: seeds[1].getrandbits(63)
    )
    assert got.rows == want.rows == 500 and len(asked) <= 12
    for part in ("top", "bottom", "random"):
        assert [r.fields for r in getattr(got, part)] == [r.fields for r in getattr(want, part)]
    # cuts are counted over the rows filled (the kept ones), each once
    kept = {r.rkey: r for part in (want.top, want.bottom, want.random) for r in part}
    assert got.cut == sum(1 for r in kept.values() if "[cut" in str(r.fields["response"])) > 0


def test_a_reduced_state_is_logged_as_it_is_from_this_rank() -> None:
    from rlpulse.producer.samples import reduce_then_fill

    state = reduce_then_fill(
        [{"score": 1.0}, {"score": "bad"}],
        "score",
        lambda idx: [{"text": "t" * 100} for _ in idx],
        origin=("elsewhere", 9),
        limits=SampleLimits(k=2, field_bytes=32),
    )
    enc = encoder()
    entry = enc.entry(3, 0.0, {NAME: state})
    assert entry is not None
    sent = decode(entry[6][0])
    assert sent.rows == 1 and {(r.role, r.rank) for r in sent.random} == {("actor", 3)}
    assert (enc.counters.samples_dropped, enc.counters.samples_cut) == (1, 1)
