"""Simulated ranks: many producer identities speaking the real wire protocol (PROTOCOL.md).

Thousands of ranks cannot be thousands of processes on a 2-core machine, so a few sender
processes each speak for many producer ids. The collector cannot tell: every message is the
byte-for-byte encoding ``rlpulse.schemas.protocol`` gives (checked by :func:`self_check`): a hello
declaring the rank's name table, then one ``metrics`` message per rank per step with the
``done`` folded in, as a producer sends ``log()`` followed by ``step_done()``.

A metrics message is assembled from pre-packed pieces (the values blob is packed once per
shape), so a simulated rank costs far less CPU than the collector spends on its message and
the sender never is the bottleneck being measured.
"""

from __future__ import annotations

import array
import random
import struct

import msgspec

from rlpulse.schemas import protocol
from rlpulse.schemas.messages import TableDecl

MEAN_CODE = 1  # Reduction.MEAN: what names outside the catalog merge by


def metric_names(n: int, prefix: str = "bench") -> list[str]:
    """``n`` realistic-length metric names outside the catalog (merged as weighted means)."""
    groups = ("actor", "critic", "rollout", "reward", "system")
    return [f"{prefix}/{groups[i % len(groups)]}/metric_{i:04d}" for i in range(n)]


class Shape:
    """The constant parts of one rank's metrics message: its name table and values blob."""

    def __init__(self, names: list[str], seed: int = 0) -> None:
        self.names = names
        rng = random.Random(seed)
        vals = array.array("d")
        for _ in names:
            x = rng.uniform(-1.0, 1.0)
            vals.extend((x, 1.0, x, x))
        self.kinds = bytes([MEAN_CODE]) * len(names)
        self.values = vals.tobytes()  # little-endian on every machine this runs on
        self.table = TableDecl(0, list(names), self.kinds)
        self._tail = b"\x00" + msgspec.msgpack.encode(self.values) + b"\x80"  # table 0, {}

    def metrics(self, producer: int, seq: int, step: int, t: float) -> bytes:
        """Exactly ``protocol.encode_metrics(producer, seq, [pack_entry(step, t, 0, ...)],
        done=step)``: the tag and seven fields, the last three the (empty) lists of sketches,
        samples and incomplete steps."""
        return b"".join(
            (
                b"\x98\x16",
                _pack_int(producer),
                _pack_int(seq),
                b"\x91\x95",
                _pack_int(step),
                b"\xcb" + struct.pack(">d", t),
                self._tail,
                _pack_int(step),
                b"\x90\x90\x90",  # no sketches, no samples, no incomplete steps
            )
        )


def _pack_int(x: int) -> bytes:
    return msgspec.msgpack.encode(x)


class SimRank:
    """One simulated producer: its id, rank and sequence counter."""

    __slots__ = ("producer", "rank", "seq")

    def __init__(self, producer: int, rank: int) -> None:
        self.producer = producer
        self.rank = rank
        self.seq = 0

    def next_seq(self) -> int:
        s = self.seq
        self.seq += 1
        return s

    def hello(self, run: str, role: str, world_size: int, shape: Shape) -> bytes:
        """Registration; its ``seq`` is the next data sequence number (nothing unacknowledged),
        as the producer sends it: hellos and heartbeats do not consume sequence numbers."""
        return protocol.encode_hello(
            self.producer,
            self.seq,
            run=run,
            role=role,
            rank=self.rank,
            world_size=world_size,
            host="sim",
            pid=self.rank,
            tables=[shape.table],
        )

    def metrics(self, shape: Shape, step: int, t: float) -> bytes:
        return shape.metrics(self.producer, self.next_seq(), step, t)

    def bye(self) -> bytes:
        return protocol.encode_bye(self.producer, self.next_seq(), {})


def sim_ranks(ranks: range, seed: int) -> list[SimRank]:
    rng = random.Random(seed)
    return [SimRank(rng.getrandbits(63), r) for r in ranks]


def self_check() -> None:
    """Fail loudly if the fast encoder ever drifts from the real one."""
    shape = Shape(metric_names(7))
    for producer, seq, step, t in ((1, 0, 0, 0.5), (2**62 + 3, 70_000, 123_456, 1.7e9 + 0.25)):
        want = protocol.encode_metrics(
            producer, seq, [protocol.pack_entry(step, t, 0, shape.values, {})], done=step
        )
        got = shape.metrics(producer, seq, step, t)
        if got != want:
            raise AssertionError("benchmarks.wire encodes differently from schemas.protocol")
        decoded = protocol.decode(got)
        assert isinstance(decoded, protocol.Metrics)
