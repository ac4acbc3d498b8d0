"""A sender that falls behind on ``Samples`` rows (issue 46, item 1): the rows it has not
reduced yet are held within ``pending_limit_bytes`` (estimated in ``log()``), what is past
it is dropped and counted; ``close()`` stops reducing at its deadline; every step that lost
values reaches the collector as ``incomplete`` and is named in a warning."""

from __future__ import annotations

import logging
import random
import sys
import threading
import time

import pytest

from rlpulse import Samples
from rlpulse.producer import Producer
from rlpulse.producer.config import MIB, ProducerConfig
from rlpulse.producer.pending import IncompleteSteps, RowBytes, row_bytes
from rlpulse.schemas import metrics as M, protocol
from tests.producer.conftest import Inbox, entries

NAME, LOSS = M.ROLLOUT_SAMPLES.name, M.ACTOR_PG_LOSS.name


def held(rows: list) -> int:
    """What ``rows`` hold, every row walked: the tuple, each mapping and each value."""
    return sys.getsizeof(tuple(rows)) + sum(
        sys.getsizeof(r) + sum(sys.getsizeof(v) for v in r.values()) for r in rows
    )


TEXTS = {
    "even": lambda i, rng: "p" * 2048 + str(i),
    "not ascii": lambda i, rng: "🙂" * 512 + str(i),  # 4 bytes a character in memory
    "uneven": lambda i, rng: "x" * rng.randrange(100, 10_000),  # a fixed seed
    "short": lambda i, rng: "ok",
}


@pytest.mark.parametrize("kind", TEXTS)
def test_the_sender_learns_a_name_s_row_size_and_log_charges_it(kind: str) -> None:
    """Once the sender measured a value of the name (32 rows spread over it), ``log()``
    charges the rows at that size, or at the first row's if larger: within 20% of what they
    hold, walked whole with ``sys.getsizeof`` (texts of even, uneven, non-ASCII and short
    lengths)."""
    rng = random.Random(7)
    make = TEXTS[kind]
    rows = [{"prompt": make(i, rng), "reward": float(i), "id": i} for i in range(20_000)]
    value = Samples(rows, key="reward")
    sizes = RowBytes()
    sizes.learn({NAME: value, LOSS: 1.0})
    again = Samples([dict(r) for r in rows], key="reward")
    got, want = sizes.estimate(NAME, again, behind=False), held(rows)
    assert abs(got - want) / want < 0.2, (got, want)


def test_log_charges_the_name_s_mean_row_and_the_growth_of_its_texts_while_behind() -> None:
    """Before the sender measured a value of the name, the first row; after, the name's
    mean row, and while the sender is behind, that plus how much longer the first row's
    text in the name's longest field is: rows that grew while it is behind show at once."""
    sizes = RowBytes()
    row = {"prompt": "p" * 100, "response": "r" * 1000, "reward": 1.0}
    small = Samples([row] * 50, key="reward")
    for behind in (False, True):
        assert sizes.estimate(NAME, small, behind) == 50 * row_bytes(row)
        assert sizes.estimate(NAME, Samples([], key="t"), behind) == 0
    sizes.learn({NAME: small})
    grown = {**row, "response": "r" * 9000}
    big = Samples([grown] + [row] * 49, key="reward")
    assert sizes.estimate(NAME, big, behind=True) == 50 * row_bytes(grown)  # it grew
    assert sizes.estimate(NAME, big, behind=False) == 50 * row_bytes(row)  # not looked at
    short = Samples([{**row, "response": ""}] + [row] * 49, key="reward")
    assert sizes.estimate(NAME, short, behind=True) == 50 * row_bytes(row)  # the mean stands
    sizes.learn({"numbers": Samples([{"reward": 1.0}], key="reward")})  # no text: whole row
    wide = Samples([{"reward": 1.0, "note": "n" * 500}] * 4, key="reward")
    assert sizes.estimate("numbers", wide, behind=True) == 4 * row_bytes(wide.rows[0])


def test_incomplete_steps_are_told_once_and_named_as_ranges() -> None:
    steps = IncompleteSteps()
    for s in (25, 26, 27, 26, 27, 30, 40, 41):
        steps.add(s)
    assert steps.take(2) == [25, 26] and steps.take(10) == [27, 30, 40, 41]
    assert steps.count == 6 and steps.describe() == "25-27, 30, 40-41"
    assert "6 steps" in steps.verdict({"dropped_unreduced": 6})


class Stall(dict):
    """A row the sender cannot read until ``gate`` is set: it stalls there, as one busy
    reducing rows does."""

    gate = threading.Event()

    def get(self, key, default=None):  # type: ignore[override]
        self.gate.wait(30)
        return super().get(key, default)


def test_rows_past_the_bound_are_dropped_counted_and_their_steps_told(inbox: Inbox, caplog) -> None:
    limit = 5 * MIB
    p = Producer(
        inbox.address,
        run="r",
        role="actor_train",
        world_size=1,
        config=ProducerConfig(pending_limit_bytes=limit, close_timeout_s=10),
    )
    Stall.gate.clear()
    p.log({NAME: Samples([Stall(reward=1.0)], key="reward"), LOSS: 0.0}, step=0)
    time.sleep(0.2)  # the sender is stuck reducing step 0's rows
    values = [
        Samples([{"text": f"{s}" + "t" * 200_000, "reward": 1.0} for _ in range(10)], "reward")
        for s in range(1, 8)
    ]
    pending = p._row_bytes.estimate(NAME, Samples([Stall(reward=1.0)], key="reward"), False)
    dropped = []
    with caplog.at_level(logging.WARNING, logger="rlpulse.producer"):
        for step, value in enumerate(values, 1):
            size = p._row_bytes.estimate(NAME, value, behind=True)  # the sender is stuck
            p.log({NAME: value, LOSS: float(step)}, step=step)
            if pending + size <= limit:
                pending += size
            else:
                dropped.append(step)
            assert p._pending - p._sender.released_pending <= limit
        assert len(dropped) >= 4  # about 2 MB each: two fit
        assert p.stats()["dropped_unreduced"] == len(dropped)
        Stall.gate.set()
        p.close()
    assert not p._sender.is_alive()
    msgs = inbox.receive(until=lambda m: any(isinstance(x, protocol.Bye) for x in m))
    got = entries(msgs)
    assert sorted({e.step for e in got}) == list(range(8)), "every step's scalar went"
    with_rows = {e.step for e in got if NAME in e.names}
    assert with_rows == set(range(8)) - set(dropped)
    told = [s for m in msgs if isinstance(m, protocol.Metrics | protocol.Bye) for s in m.incomplete]
    assert told == dropped
    (bye,) = [m for m in msgs if isinstance(m, protocol.Bye)]
    assert bye.stats["dropped_unreduced"] == len(dropped)
    text = caplog.text
    assert "pending_limit_bytes" in text and f"at step {dropped[0]} dropped" in text
    assert f"{len(dropped)} steps went to the collector without some of their values" in text


class Slow(dict):
    """A row that takes 1 ms to read: a value of 100 of them takes the sender 0.1 s."""

    def get(self, key, default=None):  # type: ignore[override]
        time.sleep(0.001)
        return super().get(key, default)


STEPS = 50


def test_close_stops_reducing_at_its_deadline_sends_the_rest_and_tells_the_steps(
    inbox: Inbox, caplog
) -> None:
    """Fifty values of 0.1 s of rows each are queued (5 s of work); close(1.0) keeps its
    last quarter for the goodbye: the rows not reduced by then are dropped, counted, their
    calls' scalars still sent and their steps told. The sender ends; before, it was
    abandoned still reducing, and the steps it had not sent were lost without a word."""
    p = Producer(inbox.address, run="r", role="actor_train", world_size=1)
    for step in range(STEPS):
        rows = [Slow(reward=float(i)) for i in range(100)]
        p.log({NAME: Samples(rows, key="reward"), LOSS: float(step)}, step=step)
    with caplog.at_level(logging.WARNING, logger="rlpulse.producer"):
        p.close(timeout=1.0)
    assert not p._sender.is_alive(), "the sender ended within close()"
    stats = p.stats()
    msgs = inbox.receive(until=lambda m: any(isinstance(x, protocol.Bye) for x in m))
    got = entries(msgs)
    assert sorted({e.step for e in got}) == list(range(STEPS))
    with_rows = {e.step for e in got if NAME in e.names}
    told = [s for m in msgs if isinstance(m, protocol.Metrics | protocol.Bye) for s in m.incomplete]
    assert 0 < len(with_rows) < STEPS
    assert told == [s for s in range(STEPS) if s not in with_rows]
    assert stats["dropped_unreduced"] == len(told) and stats["dropped_send"] == 0
    assert f"steps {min(told)}-{STEPS - 1}" in caplog.text


def test_a_close_that_could_not_send_names_the_steps_it_lost(caplog) -> None:
    """No collector: the calls never went out (``dropped_send``), and the warning says which
    steps they were, as ranges."""
    from tests.support.net import free_port

    p = Producer(f"tcp://127.0.0.1:{free_port()}", run="r", role="actor_train", world_size=1)
    for step in (*range(5), 9):
        p.log({LOSS: float(step)}, step=step)
    time.sleep(0.1)
    with caplog.at_level(logging.WARNING, logger="rlpulse.producer"):
        p.close(timeout=0.5)
    assert p.stats()["dropped_send"] == 6
    assert (
        "6 log() calls never sent, lost (stats() dropped_send): no collector answered, of steps 0-4, 9"
        in caplog.text
    )
