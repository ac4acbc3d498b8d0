"""Forgetting a run that ended, in the registry of who belongs to it (``Membership``): its
producers and members go, a tombstone stays (``rlpulse.collector.runs.retention``, which says
when and why). The aggregator calls these, and forgets the rest (its ``Run``, the output's
state, the sinks': ``Aggregator.forget``).

>>> # pids = forget_run(membership, "r", last_emitted=41, now=now)
"""

from __future__ import annotations

from rlpulse.collector.runs.membership import Membership


def forget_run(membership: Membership, name: str, last_emitted: int, now: float) -> list[int]:
    """Forget the run ``name`` and its producers, leaving a tombstone; their ids (their
    delivery numbering stays while the tombstone does: ``Tombstones.dropped``)."""
    producers = membership.producers
    pids = [p.pid for p in producers.values() if p.run == name]
    late = {pid: producers[pid].late for pid in pids}
    for pid in pids:
        del producers[pid]
        membership.unlist(pid)
        membership.resuming.discard(pid)
        membership.health.forget_producer(pid)
        for told in membership.relay_late.values():
            told.pop(pid, None)
    del membership.runs[name]
    current = membership.current
    for asked in [a for a, n in current.items() if n == name]:
        del current[asked]
    for relay in membership.relays.values():
        for alias in [a for a, n in relay.aliases.items() if n == name]:
            del relay.aliases[alias]
    membership.tombstones.add(name, last_emitted, late, now)
    membership.health.producers = len(producers)
    return pids


def forget_gone(membership: Membership, now: float, retention_s: float) -> list[int]:
    """Forget the producers of forgotten runs that came back (``ghosts``) and the
    endpoint-only ones, once silent for ``retention_s`` (and presumed gone), and the
    tombstones past their age; the ids whose delivery numbering may go."""
    out = []
    tombstones = membership.tombstones
    silent_s = max(retention_s, membership.liveness_s)
    for kept in (membership.ghosts, membership.endpoints):
        for pid in [p.pid for p in kept.values() if now - p.last_seen >= silent_s]:
            prod = kept.pop(pid)
            membership.unlist(pid)
            membership.health.forget_producer(pid)
            if tombstones.run_of(pid) is None:
                out.append(pid)
            elif prod.late:  # told again if it comes back once more
                tombstones.late[pid] = prod.late
    tombstones.prune(now)
    out += tombstones.dropped
    tombstones.dropped = []
    return out
