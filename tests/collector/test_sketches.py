"""Distribution metrics through the collector: 1M tokens split raggedly over 8 ranks, half
behind relay A and half behind relay B, merged at the root. Every message is encoded and
decoded as on the wire. The root's p50/p90/p99 equal those of one collector that saw every
rank, equal the quantiles of the sketch of all the tokens (the merge is exact), and lie
within the stated relative error of numpy's exact quantiles; mean, max and min are exact."""

from __future__ import annotations

import numpy as np
import pytest

from rlpulse.producer import Masked
from rlpulse.producer.sketch import sketch_value
from rlpulse.schemas import metrics as M, protocol as P, sketch as S
from rlpulse.schemas.messages import TableDecl
from rlpulse.schemas.reductions import Reduction
from tests.collector.helpers import hello
from tests.collector.tiers import Tiers

ADV, LOSS = M.CRITIC_ADVANTAGES.name, M.ACTOR_PG_LOSS.name
RANKS, TOKENS = 8, 1_000_000
BOUND = S.ALPHA * (1 + 1e-9)


DECL = TableDecl(0, [ADV, LOSS], bytes([Reduction.MEAN, Reduction.MEAN]))
"""The one table of every rank's hello."""


def metrics(pid: int, seq: int, step: int, chunk: np.ndarray, mask: np.ndarray) -> P.Metrics:
    """One ``log()`` call as the producer encodes it (the sketch beside the state rows)."""
    state, nonfinite, sketch = sketch_value(Masked(chunk, mask))
    assert nonfinite == 0
    rows = np.array([state, (1.0, 1.0, 1.0, 1.0)], dtype="<f8").tobytes()
    entry = P.pack_entry(step, 0.0, 0, rows, {}, {0: sketch})
    return P.decode(P.encode_metrics(pid, seq, [entry]))  # type: ignore[return-value]


def ragged_split(rng: np.random.Generator, n: int, parts: int) -> list[int]:
    cuts = np.sort(rng.choice(np.arange(1, n), parts - 1, replace=False))
    return np.diff(np.concatenate([[0], cuts, [n]])).tolist()


@pytest.mark.parametrize("seed", [0, 1])
def test_a_million_tokens_over_8_ranks_and_two_relays(seed: int) -> None:
    rng = np.random.default_rng(seed)
    tokens = np.concatenate(  # advantages: a heavy-tailed mix of both signs and exact zeros
        [rng.standard_t(3, TOKENS // 2), rng.normal(0.5, 0.01, TOKENS // 4), np.zeros(10)]
    )
    tokens = np.concatenate([tokens, rng.lognormal(0, 3, TOKENS - tokens.size)])
    mask = rng.random(tokens.size) < 0.9  # padding that is not a token
    t = Tiers()
    for rank in range(RANKS):
        t.send(
            "A" if rank < RANKS // 2 else "B", hello(rank + 1, rank=rank, ws=RANKS, tables=[DECL])
        )
    start, sizes = 0, ragged_split(rng, tokens.size, RANKS)
    for rank, size in enumerate(sizes):
        via, pid = ("A" if rank < RANKS // 2 else "B"), rank + 1
        seq = 1
        calls = ragged_split(rng, size, int(rng.integers(1, 5)))  # several log() calls
        for n in calls:
            t.send(via, metrics(pid, seq, 0, tokens[start : start + n], mask[start : start + n]))
            start, seq = start + n, seq + 1
        t.send(via, P.Done(pid, seq, 0))
    assert start == tokens.size
    assert [r.step for r in t.out] == [0] and not t.out[0].partial
    t.same_as_reference()
    got = t.out[0].metrics
    x = tokens[mask]
    whole = S.counts_of(x)
    assert got[f"{ADV}/mean"] == pytest.approx(x.mean(), rel=1e-12)
    assert (got[f"{ADV}/max"], got[f"{ADV}/min"]) == (x.max(), x.min())
    for q, stat in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
        exact = float(np.quantile(x, q, method="inverted_cdf"))
        value = got[f"{ADV}/{stat}"]
        assert value == S.quantile(whole, q, low=x.min(), high=x.max())  # merge is exact
        assert abs(value - exact) <= BOUND * abs(exact), (stat, value, exact)
    assert f"{LOSS}/p50" not in got and t.root.health.malformed.get("bad_sketch", 0) == 0


def test_a_bad_sketch_is_counted_and_the_rest_of_the_entry_kept() -> None:
    t = Tiers()
    t.send("A", hello(1, rank=0, ws=RANKS, tables=[DECL]))
    good = metrics(1, 1, 0, np.array([1.0, 2.0]), np.ones(2, bool))
    bad = P.Metrics(1, 1, good.entries, -1, [(0, 0, b"\x01\x04\x01\x00")])
    t.ref.handle(bad, 0.0)
    t.ref.handle(P.Done(1, 2, 0), 0.0)
    t.ref.flush()
    assert t.ref.health.malformed["bad_sketch"] == 1
    got = t.ref_out[0].metrics
    assert got[f"{ADV}/mean"] == 1.5 and f"{ADV}/p50" not in got


def test_an_old_producer_without_sketches_still_reports_mean_max_min() -> None:
    t = Tiers()
    t.send("A", hello(1, rank=0, ws=RANKS, tables=[DECL]))
    plain = metrics(1, 1, 0, np.array([1.0, 3.0]), np.ones(2, bool))
    old = P.decode(P.encode_metrics(1, 1, [e[:5] for e in plain.entries]))
    t.ref.handle(old, 0.0)
    t.ref.handle(P.Done(1, 2, 0), 0.0)
    t.ref.flush()
    got = t.ref_out[0].metrics
    assert (got[f"{ADV}/mean"], got[f"{ADV}/max"], got[f"{ADV}/min"]) == (2.0, 3.0, 1.0)
    assert f"{ADV}/p50" not in got


def test_an_older_collector_ignores_the_sketches() -> None:
    """The sketches are an optional last field: a decoder without it reads the message."""
    import msgspec

    class OldMetrics(msgspec.Struct, array_like=True, tag=22):
        producer: int
        seq: int
        entries: list[tuple[int, float, int, bytes, dict[str, int]]]
        done: int = -1

    msg = metrics(1, 1, 0, np.array([1.0, 3.0]), np.ones(2, bool))
    old = msgspec.msgpack.Decoder(OldMetrics).decode(P.encode(msg))
    assert old.entries == msg.entries


def test_a_replaced_process_takes_its_sketch_with_it() -> None:
    """A rank restarted mid-step: its old process's data is withdrawn, sketch included, and
    the step reports the new process's samples only."""
    t = Tiers()
    one = lambda *m: [t.ref.handle(x, t.clock[0]) for x in m]  # noqa: E731
    solo = P.Hello(1, 1, "r", "actor_train", 0, 1, "host", 1, tables=[DECL])
    one(solo, metrics(1, 1, 0, np.full(100, 50.0), np.ones(100, bool)))
    again = P.Hello(2, 1, "r", "actor_train", 0, 1, "host", 2, tables=[DECL])
    one(again, metrics(2, 1, 0, np.array([1.0, 2.0, 3.0]), np.ones(3, bool)), P.Done(2, 2, 0))
    t.ref.flush()
    got = t.ref_out[0].metrics
    assert got[f"{ADV}/max"] == 3.0
    # without the withdrawal, the old samples (50.0, clamped to the max) would be the p50
    assert abs(got[f"{ADV}/p50"] - 2.0) <= 0.02 and abs(got[f"{ADV}/p99"] - 3.0) <= 0.03
