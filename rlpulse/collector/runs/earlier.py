"""What an earlier instance of this collector may have written, for a collector that keeps no
``state_dir``: told by the producers' hellos, flagged on the records, counted.

A collector without ``state_dir`` that stops mid-run (Ctrl-C, a crash) and starts again knows
nothing of what it applied before; its producers know what they sent. Each hello says what of
its producer's data went out so far (``Hello.went_out``: the highest sequence number and the
highest ``log()`` step). The first hello of a producer this collector does not know, saying
data went out, tells it that the collector that was there (an earlier instance) may have
applied that data and written records of those steps:

* every step of the run up to the highest such step, over the run's producers, is
  *continued*: a record of it written here holds only the calls that reached this instance,
  and an earlier record may hold the others. It goes out flagged ``partial`` and
  ``continued`` (``rlpulse.schemas.record.StepRecord``).
* the producer's messages from its hello's ``seq`` (its oldest unacknowledged) up to the
  highest number that went out were sent before and are sent again now: the earlier instance
  may have applied them without acknowledging them (a crash within its acknowledgement
  delay), so the calls they hold may be counted in both records. A record holding such calls
  names their ranks in ``resent``.

Counted: ``continued_steps`` and ``resent_entries`` (``rlpulse.collector.health``), on
/metrics and in the stop line. With ``state_dir`` none of this applies: the collector knows
what it applied from its write-ahead log, and loses and repeats nothing.

>>> earlier = Earlier(Health())
>>> earlier.flags("r", 3)
(False, ())
"""

from __future__ import annotations

import logging

from rlpulse.collector.health import Health
from rlpulse.collector.ratelog import RateLimitedLog
from rlpulse.collector.runs.members import ProducerInfo, Slot
from rlpulse.schemas import protocol

log = logging.getLogger("rlpulse.collector")


class Earlier:
    """The steps of each run an earlier instance of this collector may have written, and the
    calls sent to it that this one merges again (see the module docstring)."""

    def __init__(self, health: Health) -> None:
        self.health = health
        self.through: dict[str, int] = {}
        """Per run, the highest step of a call that went out to an earlier instance."""
        self.resending: dict[int, int] = {}
        """Per producer resending what went out before: the last number it sent then."""
        self._resent: dict[str, dict[int, dict[Slot, int]]] = {}
        """Per run and open step, the resent calls merged into it, by slot."""
        self._ratelog = RateLimitedLog(log)

    def hello(self, prod: ProducerInfo, msg: protocol.Hello) -> None:
        """The first hello here of ``prod``, a producer of a run (it holds a slot)."""
        seq, step = msg.went_out
        if step > self.through.get(prod.run, -1):
            self.through[prod.run] = step
            self._ratelog.warn(
                f"earlier:{prod.run}",
                f"run {prod.run!r}: {prod.role}/{prod.rank} sent steps up to {step} to an "
                "earlier instance of this collector; without state_dir, what that one wrote "
                f"is unknown here, so the records of steps up to {step} written here are "
                "flagged partial and continued (with state_dir a restart loses and repeats "
                "nothing)",
            )
        if seq >= msg.seq:  # sent, never acknowledged: it sends them again now
            self.resending[prod.pid] = seq

    def metrics(self, prod: ProducerInfo, msg: protocol.Metrics, last_emitted: int) -> None:
        """``prod``'s data message, about to be merged into its run (whose steps up to
        ``last_emitted`` went out already: late, not merged): note its calls if it is one
        the earlier instance may have applied."""
        last = self.resending.get(prod.pid)
        if last is None:
            return
        if msg.seq >= last:
            del self.resending[prod.pid]  # what follows is new
            if msg.seq > last:
                return
        steps = self._resent.setdefault(prod.run, {})
        slot = prod.slot
        for entry in msg.entries:
            step = entry[0]
            if step > last_emitted:
                by_slot = steps.setdefault(step, {})
                by_slot[slot] = by_slot.get(slot, 0) + 1

    def flags(self, run: str, step: int) -> tuple[bool, tuple[str, ...]]:
        """As ``step`` of ``run`` goes out: whether its record is continued, and the ranks
        (``role/rank``) whose resent calls it holds; counted."""
        steps = self._resent.get(run)
        by_slot = steps.pop(step, None) if steps else None
        if step > self.through.get(run, -1):
            return False, ()
        self.health.continued_steps += 1
        resent: tuple[str, ...] = ()
        if by_slot:
            self.health.resent_entries += sum(by_slot.values())
            resent = tuple(f"{role}/{rank}" for role, rank in sorted(by_slot))
        return True, resent

    def forget(self, run: str, pids: list[int]) -> None:
        """The run and its producers are forgotten (``runs.retention``)."""
        self.through.pop(run, None)
        self._resent.pop(run, None)
        for pid in pids:
            self.resending.pop(pid, None)
