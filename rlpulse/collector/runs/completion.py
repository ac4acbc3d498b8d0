"""When an open step is done: the completion policy of a run's steps.

A step is *complete* when every expected slot has finished it; it is emitted *partial*,
naming the missing slots, when ``grace_s`` has passed since the first slot finished it, when
every missing slot is gone (``Membership.gone``), or, as a last resort, when more than
``HARD_OPEN_FACTOR`` times ``max_open_steps`` steps of the run are open (the oldest goes).
Below that, ``max_open_steps`` is kept by holding back producers that run ahead
(:func:`admits`, :func:`has_room`), not by emitting steps early. A new run's steps wait ``settle_s`` for roles
still registering, unless a producer declared the topology. A step whose slot lost its data
at a takeover (``StepState.withdrawn``, ``tainted``), or whose producer said it dropped some
of its values (``StepState.incomplete``), names that slot missing.

>>> list(due({}, Members(0.0), 0.0, grace_s=30, settle_s=0, max_open_steps=8,
...          gone=lambda slot: False))
[]
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from rlpulse.collector.runs.members import Members, ProducerInfo, Slot
from rlpulse.collector.runs.steps import StepState

HARD_OPEN_FACTOR = 8
"""Open steps beyond ``max_open_steps`` times this are emitted partial, oldest first: the
bound that holds even when producers' batches overshoot the window."""


def due(
    steps: Mapping[int, StepState],
    members: Members,
    now: float,
    *,
    grace_s: float,
    settle_s: float,
    max_open_steps: int,
    gone: Callable[[Slot], bool],
) -> Iterator[tuple[StepState, set[Slot]]]:
    """The open steps to emit now, oldest first, each with its missing slots. Stops at the
    first step that must still wait: steps are emitted in order."""
    expected = members.expected()
    for step in sorted(steps):
        state = steps[step]
        if (
            len(state.done) < len(expected)
            and not (state.withdrawn or state.tainted or state.incomplete)
            and len(steps) <= max_open_steps
            and (state.first_done_at is None or now - state.first_done_at < grace_s)
            and waits_on(state, expected, gone)
        ):
            return  # the common case, decided without listing every missing slot
        # done only ever holds expected slots, so counting them says "complete"
        missing = expected - state.done if len(state.done) < len(expected) else set()
        gave_none = lost(state, members) if state.withdrawn or state.incomplete else set()
        missing |= gave_none
        if not missing and members.settling(now, settle_s):
            return  # other roles of a new run may still be starting up
        if missing:
            overflow = len(steps) > max_open_steps
            graced = state.first_done_at is not None and now - state.first_done_at >= grace_s
            if not (overflow or graced or all(s in gave_none or gone(s) for s in missing)):
                return
        yield state, missing


def waits_on(state: StepState, expected: set[Slot], gone: Callable[[Slot], bool]) -> bool:
    """Whether some expected slot has neither finished ``state`` nor gone: the step must
    wait. The slot found last time is asked first, so a poll costs O(1) while it still
    waits, not a pass over every rank (which was most of a poll at 1,024 ranks)."""
    slot = state.waiting_on
    if slot is not None and slot in expected and slot not in state.done and not gone(slot):
        return True
    done = state.done
    slot = next((s for s in expected if s not in done and not gone(s)), None)
    state.waiting_on = slot
    return slot is not None


def lost(state: StepState, members: Members) -> set[Slot]:
    """Slots that finished ``state`` without their data in it: withdrawn (a replaced
    process's) and not given again by the new holder, or given only through a relay
    together with the replaced process's; or without all of it, by their producer's word
    (``incomplete``)."""
    return (
        state.tainted
        | (state.incomplete & state.done)
        | {
            slot
            for slot in state.withdrawn
            if slot in state.done and members.slots.get(slot) not in state.contributors
        }
    )


def admits(
    steps: Mapping[int, StepState],
    last_emitted: int,
    prod: ProducerInfo,
    entries: list,
    window: int,
    closing: bool,
) -> bool:
    """Whether ``prod``'s entries may be applied now, given its run's open ``steps``
    (``Aggregator.admits``): always, unless they open a step beyond the ``window`` and
    ``prod`` is ahead."""
    if len(steps) < window:
        return True
    opens = {e[0] for e in entries if e[0] not in steps and e[0] > last_emitted}
    if not opens:
        return True
    if closing and len(steps) + len(opens) <= window * HARD_OPEN_FACTOR:
        return True
    # It opens a step. Hold it only if this producer is ahead: it has finished the oldest
    # open step. One that still owes it is what the window waits for: always admitted.
    return prod.watermark < min(steps)


def has_room(steps: Mapping[int, StepState], prod: ProducerInfo, window: int) -> bool:
    """``prod``, held back, may go on (``Aggregator.has_room``)."""
    if len(steps) <= window // 2:
        return True
    return prod.watermark < min(steps)


def overcounted(
    state: StepState, members: Members, producers: Mapping[int, ProducerInfo]
) -> set[Slot]:
    """Roles of ``state`` with more contributing processes than their world size (which
    withdrawal at takeovers prevents for direct producers): as slots to name missing."""
    if len(state.contributors) <= len(members.expected()) and not state.tainted:
        return set()  # the common case: no more processes than ranks in all
    per_role: dict[str, int] = {}
    for pid in state.contributors:
        prod = producers.get(pid)
        if prod is not None:
            per_role[prod.role] = per_role.get(prod.role, 0) + 1
    return {
        (role, -1) for role, count in per_role.items() if count > members.roles.get(role, count)
    }
