"""Steps a producer says it sent without some of their values (issue 46, item 1): the
``incomplete`` element of ``metrics``, ``done``, ``bye`` and a relay's ``delta``. Each such
step is emitted partial naming the rank, once the rank has finished it; a step only the
notice names is opened for it (emitted, never simply missing); one already emitted is
counted; the write-ahead log's replay and a relay carry the notice as well."""

from __future__ import annotations

import msgspec

from rlpulse.schemas import metrics as M, protocol as P
from tests.collector.helpers import Harness, hello, metrics, table, through_a_restart
from tests.collector.tiers import Tiers

LOSS = M.ACTOR_PG_LOSS.name
RANK0, RANK1 = ("actor_train/0",), ("actor_train/1",)
TABLES = [table([LOSS])]
"""What the hellos of the replayed tests declare (they skip ``Declaring``)."""


def lost(msg: P.Metrics, *steps: int) -> P.Metrics:
    """``msg`` carrying ``steps`` as incomplete, through the codec."""
    return P.decode(P.encode(msgspec.structs.replace(msg, incomplete=list(steps))))  # type: ignore[return-value]


def two_ranks() -> Harness:
    h = Harness()
    h.send(hello(1, rank=0, ws=2), hello(2, rank=1, ws=2))
    return h


def test_a_step_a_rank_sent_incomplete_goes_out_partial_naming_it_with_every_value_sent() -> None:
    h = two_ranks()
    h.send(lost(metrics(1, 0, {LOSS: 1.0}), 0), metrics(2, 0, {LOSS: 3.0}))
    h.send(metrics(1, 1, {LOSS: 1.0}), metrics(2, 1, {LOSS: 3.0}))
    record = h.records[0]
    assert (record.step, record.partial, record.missing) == (0, True, RANK0)
    assert record.metrics[LOSS] == 2.0 and record.ranks == 2  # what both ranks did send
    assert h.agg.health.incomplete_steps == 1 and h.agg.health.partial_steps == 1


def test_the_step_still_waits_for_the_rank_that_said_it_incomplete_to_finish_it() -> None:
    """The notice says values are missing, not that the rank is done with the step: more of
    its calls for the step may come. Only once it finished the step does the step go."""
    h = two_ranks()
    h.send(lost(metrics(1, 0, {LOSS: 1.0}), 0), metrics(2, 0, {LOSS: 3.0}), P.Done(2, 2, 0))
    assert not h.records
    h.send(metrics(1, 0, {LOSS: 5.0}))  # another call of rank 0 at step 0
    assert not h.records
    h.send(P.Done(1, 3, 0))
    (record,) = h.records
    assert record.missing == RANK0 and record.metrics[LOSS] == 3.0


def test_a_step_only_the_notice_names_is_opened_and_emitted_partial_not_missing() -> None:
    """Both ranks lost every value of step 1 (its calls held nothing else): the step was
    never sent, yet the sinks get it, partial, naming both (a done and a bye carry it)."""
    h = two_ranks()
    h.send(metrics(1, 0, {LOSS: 1.0}), metrics(2, 0, {LOSS: 3.0}))
    h.send(P.decode(P.encode_done(1, 2, 1, [1])), P.decode(P.encode_bye(2, 2, {}, [1])))
    h.send(P.Bye(1, 3, {}))
    assert h.steps() == [0, 1]
    assert not h.records[0].partial
    record = h.records[1]
    assert record.partial and record.missing == (*RANK0, *RANK1) and not record.metrics
    assert h.agg.health.incomplete_steps == 2


def test_a_notice_for_a_step_already_emitted_is_counted() -> None:
    h = two_ranks()
    h.send(metrics(1, 0, {LOSS: 1.0}), metrics(2, 0, {LOSS: 3.0}))
    h.tick(31)  # grace: step 0 goes out partial, rank 0 still in it
    assert h.steps() == [0]
    h.send(lost(metrics(1, 1, {LOSS: 1.0}), 0))
    assert h.steps() == [0] and h.agg.health.incomplete_steps == 1


def test_the_notice_survives_a_restart_through_the_write_ahead_log() -> None:
    order = [
        hello(1, rank=0, ws=2, tables=TABLES),
        hello(2, rank=1, ws=2, tables=TABLES),
        *(metrics(2, s, {LOSS: float(s)}) for s in range(6)),
        *(
            lost(metrics(1, s, {LOSS: 1.0}), s) if s % 2 else metrics(1, s, {LOSS: 1.0})
            for s in range(6)
        ),
        P.Bye(1, 2, {}),
        P.Bye(2, 2, {}),
    ]
    for checkpoint_at, crash_at in ((0.3, 0.6), (0.5, 0.9), (0.1, 0.95)):
        got, want = through_a_restart(order, checkpoint_at, crash_at)
        assert [(r.step, r.missing) for r in got] == [(r.step, r.missing) for r in want]
    assert [(r.step, r.missing) for r in want] == [(s, RANK0 if s % 2 else ()) for s in range(6)]


def test_a_relay_passes_the_notice_to_the_root() -> None:
    t = Tiers()
    t.send("A", hello(1, rank=0, ws=2))
    t.send("B", hello(2, rank=1, ws=2))
    t.send("A", lost(metrics(1, 0, {LOSS: 1.0}), 0), P.Done(1, 2, 0))
    t.send("B", metrics(2, 0, {LOSS: 3.0}), P.Done(2, 2, 0))
    (record,) = t.out
    assert record.missing == RANK0 and record.metrics[LOSS] == 2.0
    t.same_as_reference()
    # A step rank 0 lost whole: nothing but the notice names it, on a done.
    for via, pid in (("A", 1), ("B", 2)):
        t.send(via, metrics(pid, 1, {LOSS: 1.0}))
    t.send("A", P.decode(P.encode_done(1, 3, 2, [2])))
    t.send("B", P.Done(2, 3, 2))
    assert [(r.step, r.missing) for r in t.out] == [(0, RANK0), (1, ()), (2, RANK0)]
    t.same_as_reference()
    assert t.root.health.late == 0


def test_a_restarted_rank_answers_for_the_steps_its_old_process_had_not_finished() -> None:
    """The old process said step 1 was incomplete but had not finished it; the restarted
    process sends step 1 whole: complete. Step 0, which the old process finished with its
    word that it lost values, stays partial."""
    h = two_ranks()
    h.send(lost(metrics(1, 0, {LOSS: 1.0}), 0), lost(metrics(1, 1, {LOSS: 1.0}), 1))
    h.send(hello(3, rank=0, ws=2))  # rank 0 restarted: a new process takes its slot
    h.send(metrics(3, 1, {LOSS: 5.0}), metrics(3, 2, {LOSS: 5.0}))
    h.send(metrics(2, 0, {LOSS: 3.0}), metrics(2, 1, {LOSS: 3.0}), metrics(2, 2, {LOSS: 3.0}))
    assert [(r.step, r.missing) for r in h.records] == [(0, RANK0), (1, ())]
    assert h.records[1].metrics[LOSS] == 4.0  # the new process's and rank 1's


def test_a_replaced_process_s_word_survives_a_restart_for_the_steps_it_had_finished() -> None:
    order = [
        hello(1, rank=0, ws=2, tables=TABLES),
        hello(2, rank=1, ws=2, tables=TABLES),
        lost(metrics(1, 0, {LOSS: 1.0}), 0),
        lost(metrics(1, 1, {LOSS: 1.0}), 1),  # finishes step 0; step 1 unfinished
        hello(3, rank=0, ws=2, tables=TABLES),
        metrics(3, 1, {LOSS: 5.0}),
        metrics(3, 2, {LOSS: 5.0}),
        *(metrics(2, s, {LOSS: 3.0}) for s in range(3)),
        P.Bye(2, 2, {}),
        P.Bye(3, 2, {}),
    ]
    # (0.72, 0.59): checkpointed after the takeover, crashed before step 0 went out, so the
    # replaced process's messages are replayed (sealing) with another process in its slot.
    for checkpoint_at, crash_at in ((0.2, 0.5), (0.72, 0.59), (0.1, 0.9)):
        got, want = through_a_restart(order, checkpoint_at, crash_at)
        assert [(r.step, r.missing) for r in got] == [(r.step, r.missing) for r in want]
    assert [(r.step, r.missing) for r in want] == [(0, RANK0), (1, ()), (2, ())]
