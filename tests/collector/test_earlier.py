"""A collector without ``state_dir`` started again mid-run knows, from its producers' hellos
(``Hello.went_out``), which steps an earlier instance of it may have written, and which calls
it merges again: their records go out ``partial`` and ``continued``, naming the ranks whose
resent calls they hold, counted (``rlpulse.collector.runs.earlier``). Before, such a record
looked like a whole step. Real processes: ``tests/integration/test_restart_without_state.py``."""

from __future__ import annotations

import msgspec

from rlpulse.schemas import protocol as P
from tests.collector.helpers import Harness, hello, metrics

A, B = 0xA, 0xB


def sent(msg: P.Message, seq: int) -> P.Message:
    """``msg`` as the producer numbered it."""
    return msgspec.structs.replace(msg, seq=seq)  # type: ignore[type-var]


def restarted(h: Harness) -> None:
    """What the restarted collector hears: rank 0 had messages 6 and 7 (its two calls of step
    4) out, unacknowledged, and resends them; rank 1 had everything acknowledged up to its
    step 4 (its first call of it), and sends its second call of step 4 now. Then both go on
    with steps 5 and 6."""
    h.send(
        sent(hello(A, rank=0, ws=2, went_out=(7, 4)), 6),
        sent(hello(B, rank=1, ws=2, went_out=(5, 4)), 6),
        sent(metrics(A, 4, {"x": 1.0}), 6),
        sent(metrics(A, 4, {"x": 1.0}), 7),
        sent(metrics(B, 4, {"x": 3.0}), 6),
    )
    for step in (5, 6):
        h.send(
            sent(metrics(A, step, {"x": 1.0}), 3 + step),
            sent(metrics(B, step, {"x": 3.0}), 2 + step),
        )


def test_a_step_an_earlier_instance_may_have_written_is_flagged_continued_and_counted() -> None:
    h = Harness()
    restarted(h)
    first, *rest = h.records
    assert first.step == 4 and first.partial and first.continued and not first.missing
    assert first.resent == ("actor_train/0",)  # rank 1's call of it was never sent before
    assert "continued" in first.why_partial() and "actor_train/0" in first.why_partial()
    assert first.to_json()["continued"] is True
    assert first.to_json()["resent"] == ["actor_train/0"]
    assert [r.step for r in rest] == [5]  # step 6 waits for a later step or goodbye
    assert not rest[0].partial and not rest[0].continued and "continued" not in rest[0].to_json()
    health = h.agg.health
    assert (health.continued_steps, health.resent_entries, health.partial_steps) == (1, 2, 1)


def test_with_state_dir_nothing_is_flagged(tmp_path) -> None:
    """With ``state_dir`` the collector knows what it applied (its write-ahead log)."""
    h = Harness(state_dir=str(tmp_path / "state"))
    restarted(h)
    assert [(r.step, r.partial, r.continued) for r in h.records] == [
        (4, False, False),
        (5, False, False),
    ]
    assert h.agg.health.continued_steps == 0


def test_a_producer_this_instance_knows_is_no_continuation() -> None:
    """A producer that reconnects to the instance it was sending to (a network blip) says
    what went out, to this very instance: nothing is flagged. Nor for a producer that never
    sent anything before its hello."""
    h = Harness()
    h.send(hello(A, rank=0, ws=2), hello(B, rank=1, ws=2))
    h.send(sent(metrics(A, 0, {"x": 1.0}), 1), sent(metrics(B, 0, {"x": 3.0}), 1))
    h.send(sent(hello(A, rank=0, ws=2, went_out=(1, 0)), 2))  # reconnected
    h.send(sent(metrics(A, 1, {"x": 1.0}), 2), sent(metrics(B, 1, {"x": 3.0}), 2))
    assert [(r.step, r.partial) for r in h.records] == [(0, False)]
    assert h.agg.health.continued_steps == 0


def test_a_continued_record_reads_back_from_its_json_line() -> None:
    h = Harness()
    restarted(h)
    record = h.records[0]
    assert type(record).from_json(record.to_json()) == record
