"""When a run is forgotten, and what is kept of it afterwards: a collector shared by a team
sees run after run, and must not keep every one of them for ever.

A run has *ended* when none of its steps is open and none of its slots is still waited for
(every producer said goodbye or is presumed gone: ``Membership.live``). An ended run is kept
whole for ``run_retention_s`` (it may still resume, and ``/metrics`` still shows it); then it
is *forgotten*: its members, producers, name table, throughput window, the sinks' state of
it (``RunForgotten``: Prometheus series, open trace and event files, W&B runs), the sink
cursors' and the checkpoint's entries for it, its producers' delivery numbering. A run that
is live again before that (a producer resumes it) is no longer ended.

What is kept is a :class:`Tombstones` entry: the run's name and last emitted step, and its
producers' ids. With it,

* a producer of a forgotten run that comes back (its hello, then its data) is recognised:
  everything it sends is counted late (``rlpulse_collector_late_entries_total``) and told
  back to it as late, as data for an emitted step is; it is never taken for a new run;
* a new process naming a forgotten run starts a new attempt (``name-2``), as for an ended
  run, or continues it with ``resume`` (its steps up to the last emitted one are late).

Tombstones are kept for ``TOMBSTONE_RETENTIONS`` times ``run_retention_s`` and at most
``MAX_TOMBSTONES`` runs (the oldest go first). Past that a run is unknown: a producer of it
that comes back registers afresh and its steps are emitted again under the run's name, and a
new process naming it starts it anew, not as an attempt.

>>> t = Tombstones(retention_s=10.0)
>>> t.add("r", 4, {7: 0, 8: 0}, now=0.0)
>>> t.run_of(7), t.last_emitted("r")
('r', 4)
>>> t.prune(now=241.0); t.run_of(7) is None
True
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

MAX_TOMBSTONES = 10_000
"""Forgotten runs remembered (name, last step, producer ids), oldest dropped first."""
TOMBSTONE_RETENTIONS = 24
"""A tombstone is kept this many times ``run_retention_s`` (a day at the default hour)."""
SWEEP_S = 1.0
"""How often runs are checked for having ended (at most; less often than every poll: the
check looks at every run)."""


@dataclass
class _Tombstone:
    last_emitted: int
    forgotten_at: float
    producers: tuple[int, ...]


class Tombstones:
    """The forgotten runs still recognised, and their producers (see the module docstring)."""

    def __init__(self, retention_s: float, max_runs: int = MAX_TOMBSTONES) -> None:
        self.keep_s = retention_s * TOMBSTONE_RETENTIONS
        self.max_runs = max_runs
        self._runs: dict[str, _Tombstone] = {}
        """By name, oldest first."""
        self._producers: dict[int, str] = {}
        self.late: dict[int, int] = {}
        """Per producer of a forgotten run, its entries counted late before (when any): a
        producer that comes back is told the total, as before."""
        self.dropped: list[int] = []
        """Producers whose tombstone went since the daemon last asked: their delivery
        numbering goes too (kept until then, so what they resend is recognised)."""
        self._now = 0.0
        """The latest time seen (:meth:`add`, :meth:`prune`): ages in the checkpoint are
        counted from it."""

    def __len__(self) -> int:
        return len(self._runs)

    def add(self, name: str, last_emitted: int, producers: Mapping[int, int], now: float) -> None:
        """``producers``: each producer's id, and its entries counted late so far."""
        self.pop(name)
        self._now = max(self._now, now)
        self._runs[name] = _Tombstone(last_emitted, now, tuple(producers))
        for pid, late in producers.items():
            self._producers[pid] = name
            if late:
                self.late[pid] = late
        while len(self._runs) > self.max_runs:
            self.pop(next(iter(self._runs)))

    def pop(self, name: str) -> int | None:
        """Drop ``name``'s tombstone (its run is known again); its last emitted step."""
        stone = self._runs.pop(name, None)
        if stone is None:
            return None
        for pid in stone.producers:
            if self._producers.get(pid) == name:
                del self._producers[pid]
                self.late.pop(pid, None)
                self.dropped.append(pid)
        return stone.last_emitted

    def prune(self, now: float) -> None:
        """Drop the tombstones older than ``keep_s``."""
        self._now = max(self._now, now)
        while self._runs:
            name, stone = next(iter(self._runs.items()))
            if now - stone.forgotten_at < self.keep_s:
                return
            self.pop(name)

    def run_of(self, pid: int) -> str | None:
        """The forgotten run producer ``pid`` belonged to, if it is remembered."""
        return self._producers.get(pid)

    def last_emitted(self, name: str) -> int | None:
        stone = self._runs.get(name)
        return stone.last_emitted if stone is not None else None

    def snapshot(self) -> list:
        """For the checkpoint: ``[name, last emitted, age in seconds, [producer id or
        [id, late entries]...]]``."""
        return [
            [
                name,
                s.last_emitted,
                round(self._now - s.forgotten_at, 3),
                [[p, self.late[p]] if p in self.late else p for p in s.producers],
            ]
            for name, s in self._runs.items()
        ]

    def restore(self, saved: Iterable[list], now: float) -> None:
        for name, last, age, pids in saved:
            producers = dict(
                (int(p[0]), int(p[1])) if isinstance(p, list) else (int(p), 0) for p in pids
            )
            self.add(str(name), int(last), producers, now - float(age))


class Ended:
    """Since when each run has been ended (``Membership.live`` false and no open step);
    :meth:`due` says which are to be forgotten. Checked at most every ``SWEEP_S``."""

    def __init__(self, retention_s: float) -> None:
        self.retention_s = retention_s
        self.since: dict[str, float] = {}
        self._every = min(SWEEP_S, retention_s / 2)
        self._next = 0.0

    def due(self, ended: Mapping[str, bool], now: float) -> list[str]:
        """The runs to forget now, given which runs are ended now (``ended``: every run
        known, by name)."""
        since = self.since
        out = []
        for name, is_ended in ended.items():
            if not is_ended:
                since.pop(name, None)
                continue
            start = since.setdefault(name, now)
            if now - start >= self.retention_s:
                out.append(name)
        for name in [n for n in since if n not in ended]:
            del since[name]
        for name in out:
            del since[name]
        return out

    def sweep_due(self, now: float) -> bool:
        """Whether a check is due now (every ``SWEEP_S``, or half the retention if shorter)."""
        if now < self._next:
            return False
        self._next = now + self._every
        return True
