"""Property-based fuzzing of the decoder and the aggregation entry points.

Valid messages are generated, then mutated byte by byte (flips, truncations, splices); every
input must either be rejected with a SchemaError or be applied without breaking the collector:
no other exception, and honest producers' results unchanged. The number of inputs tried is
printed (``pytest -s``) and asserted; ``RLPULSE_FUZZ_EXAMPLES`` sets how many.
"""

from __future__ import annotations

import array
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.intake.delivery import Delivery
from rlpulse.collector.runs.aggregator import Aggregator
from rlpulse.schemas import SchemaError, protocol as P, protocol_v1 as V1
from rlpulse.schemas.messages import TableDecl
from rlpulse.schemas.values import invalid_rows

EXAMPLES = int(os.environ.get("RLPULSE_FUZZ_EXAMPLES", "300"))
"""Inputs per fuzz test in ``make test``; a long run: ``RLPULSE_FUZZ_EXAMPLES=20000``."""
tried = {"decoder": 0, "pipeline": 0}

names = st.sampled_from(
    [
        "actor/pg_loss",
        "critic/advantages",
        "actor/lr",
        "time/rollout",
        "custom/x",
        "actor/ratio_max",
        "system/tps",
    ]
)
floats = st.floats(allow_nan=True, allow_infinity=True, width=64)


TABLES = [
    TableDecl(0, ["actor/pg_loss", "critic/advantages"], bytes([1, 1])),
    TableDecl(1, ["actor/lr", "custom/x", "system/tps"], bytes([6, 4, 3])),
    TableDecl(2, ["time/rollout"], bytes([4])),
]
"""What every version-2 hello in the fuzzed traffic declares (table 3 is never declared)."""


def rows(draw, n: int) -> bytes:
    vals = array.array("d")
    for _ in range(n):
        s, w = draw(st.floats(-1e6, 1e6)), draw(st.floats(0, 1e6))
        lo, hi = sorted([draw(st.floats(-1e6, 1e6)), draw(st.floats(-1e6, 1e6))])
        vals.extend((s, w, lo, hi))
    return vals.tobytes()


@st.composite
def valid_message(draw) -> bytes:
    pid = draw(st.integers(1, 3))
    kind = draw(st.sampled_from(["hello", "metrics", "done", "heartbeat", "bye"]))
    seq = draw(st.integers(0, 6))
    v1 = draw(st.booleans())  # both versions reach the collector
    if kind == "hello":
        ws = draw(st.integers(1, 3))
        args = {
            "run": "r",
            "role": draw(st.sampled_from(["a", "b"])),
            "rank": draw(st.integers(0, ws - 1)),
            "world_size": ws,
            "host": "h",
            "pid": 1,
        }
        return (
            V1.encode_hello(pid, seq, **args)
            if v1
            else P.encode_hello(pid, seq, **args, tables=TABLES)
        )
    codec = V1 if v1 else P
    if kind == "done":
        return codec.encode_done(pid, seq, draw(st.integers(0, 5)))
    if kind in ("heartbeat", "bye"):
        encode = codec.encode_heartbeat if kind == "heartbeat" else codec.encode_bye
        return encode(pid, seq, {"dropped_send": draw(st.integers(0, 9))})
    entries = []
    for _ in range(draw(st.integers(1, 3))):
        step = draw(st.integers(0, 5))
        if v1:
            ns = draw(st.lists(names, min_size=0, max_size=4, unique=True))
            kinds = bytes(draw(st.integers(1, 6)) for _ in ns)
            entries.append(V1.pack_entry(step, 1.0, ns, kinds, rows(draw, len(ns)), {}))
        else:
            table = draw(st.integers(0, 3))
            size = len(TABLES[table].names) if table < 3 else 2
            entries.append(P.pack_entry(step, 1.0, table, rows(draw, size), {}))
    if v1:
        return V1.encode_metrics(pid, seq, entries)
    return P.encode_metrics(pid, seq, entries, draw(st.integers(-1, 5)))


@st.composite
def mutated(draw) -> bytes:
    data = bytearray(draw(valid_message()))
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.sampled_from(["flip", "truncate", "insert", "splice_float"]))
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        if op == "flip":
            data[i] ^= draw(st.integers(1, 255))
        elif op == "truncate":
            del data[i:]
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        else:
            data[i : i + 8] = array.array("d", [draw(floats)]).tobytes()
    return bytes(data)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_decoder_rejects_or_accepts_never_crashes(data: bytes) -> None:
    tried["decoder"] += 1
    try:
        msg = P.decode(data)
    except SchemaError as exc:
        assert exc.reason
        return
    if isinstance(msg, P.Metrics):
        for _, _, table, values, _ in msg.entries:
            if not isinstance(table, int):  # version 1 checks rows itself; version 2 in bulk
                rows = np.frombuffer(values, dtype="<f8").reshape(-1, 4)
                assert invalid_rows(rows) is None


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(mutated(), min_size=1, max_size=12))
def test_aggregation_survives_any_accepted_sequence_and_honest_results_hold(
    stream: list[bytes],
) -> None:
    tried["pipeline"] += len(stream)
    records = []
    agg = Aggregator(records.append, CollectorConfig(grace_s=5, liveness_s=5, settle_s=0))
    delivery = Delivery(agg.health)
    # An honest producer (id 99) interleaved with the fuzzed traffic.
    honest = [
        P.encode_hello(
            99,
            1,
            run="honest",
            role="w",
            rank=0,
            world_size=1,
            host="h",
            pid=1,
            tables=[TableDecl(0, ["actor/pg_loss"], bytes([1]))],
        ),
        P.encode_metrics(
            99,
            1,
            [
                P.pack_entry(
                    0, 1.0, 0, array.array("d", [6.0, 3.0, float("nan"), float("nan")]).tobytes()
                )
            ],
        ),
        P.encode_bye(99, 2, {}),
    ]
    now = 0.0
    for i, data in enumerate(stream + honest):
        now += 0.5
        try:
            msg = P.decode(data)
        except SchemaError:
            continue
        for accepted, _ in delivery.accept(msg, b"id", data):
            agg.handle(accepted, now)
        agg.poll(now)
        if i % 3 == 0:
            delivery.acks()
    agg.poll(now + 100)
    agg.flush()
    mine = [r for r in records if r.run == "honest"]
    assert len(mine) == 1 and mine[0].metrics["actor/pg_loss"] == 2.0 and not mine[0].partial
    for record in records:
        assert all(np.isfinite(v) for v in record.metrics.values())
    assert len({(r.run, r.step) for r in records}) == len(records)  # each step at most once


def test_zz_report_inputs_tried() -> None:
    if not tried["decoder"] or not tried["pipeline"]:
        pytest.skip("run with the fuzz tests above")
    print(
        f"\nfuzz: {tried['decoder']} decoder inputs, {tried['pipeline']} messages through delivery+aggregation"
    )
    assert tried["decoder"] >= EXAMPLES
