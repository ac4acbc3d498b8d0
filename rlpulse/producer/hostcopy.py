"""The caller's half of "copy now, reduce later": which host values of a ``log()`` call are
copied together (a call's per-token tensors sharing a mask: one :class:`Rows`), which one by
one (a :class:`Snapshot`, or a distribution's ``Samples``), and which are reduced at once
(small ones, and any past the room left for copies). Runs in the training thread, inside
``log()``: every line here is paid for by the caller (``benchmarks/caller_cost.py``). The
sender thread reduces the copies later (``rlpulse.producer.copies.reduce_copies``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlpulse.producer.buffers import Buffers
from rlpulse.producer.copies import Snapshot, alike, row_key, snapshot_rows, snapshot_value
from rlpulse.producer.reduce import InvalidValue
from rlpulse.producer.sketch import snapshot_value as snapshot_dist

Invalid = Callable[[dict[Any, Any], str, InvalidValue], None]
"""What takes a value that cannot be read: (payload, name, why); it counts it and puts a
placeholder in the payload."""


class HostCopies:
    """Copies host values for the sender: ``dists`` are the catalog's distribution names
    (sketched, so copied one by one), ``buffers`` the pool the copies' arrays come from.

    >>> # copied = HostCopies(dists, Buffers()).copy(payload, ["x"], room, invalid)
    """

    def __init__(self, dists: frozenset[str], buffers: Buffers) -> None:
        self._dists = dists
        self._buffers = buffers

    def copy(self, payload: dict[Any, Any], names: list[str], room: float, invalid: Invalid) -> int:
        """Copy (or reduce now) the host values of ``names`` in ``payload``, in place, within
        ``room`` bytes of copies; return the bytes copied. Alike per-token arrays of a call
        (one mask, dtype and shape) are copied together (:func:`snapshot_rows`), the rest one
        by one; a value that cannot be read goes to ``invalid(payload, name, exc)``."""
        masks: dict[int, Any] = {}
        groups: dict[tuple[Any, ...] | None, list[str]] | None = None
        if len(names) > 1 and self._dists.isdisjoint(names):
            values = [payload[name] for name in names]
            if alike(values):  # the common call: one group, without a key per value
                copied = self._copy_together(payload, names, values, masks, room)
                if copied:
                    return copied
                groups = {None: names}  # cannot be copied together: one by one
        if groups is None:
            groups = self._groups(payload, names)
        copied = 0
        for key, group in groups.items():
            if key is not None and len(group) > 1:
                values = [payload[name] for name in group]
                together = self._copy_together(payload, group, values, masks, room)
                if together:
                    copied += together
                    room -= together
                    continue
            for name in group:
                try:
                    snap = (
                        snapshot_dist(payload[name], masks, room, self._buffers)
                        if name in self._dists
                        else snapshot_value(payload[name], masks, room, buffers=self._buffers)
                    )
                except InvalidValue as exc:
                    invalid(payload, name, exc)
                    continue
                if isinstance(snap, Snapshot):
                    copied += snap.nbytes
                    room -= snap.nbytes
                payload[name] = snap
        return copied

    def _copy_together(
        self,
        payload: dict[Any, Any],
        names: list[str],
        values: list[Any],
        masks: dict[int, Any],
        room: float,
    ) -> int:
        """Copy the alike ``values`` of ``names`` into one ``Rows``, put under each name in
        ``payload``; the bytes copied, 0 when they cannot be copied together."""
        rows = snapshot_rows(names, values, masks, room, self._buffers)
        if rows is None:
            return 0
        payload.update(dict.fromkeys(names, rows))
        return rows.nbytes

    def _groups(
        self, payload: dict[Any, Any], names: list[str]
    ) -> dict[tuple[Any, ...] | None, list[str]]:
        """``names`` grouped by what lets their values be copied together
        (:func:`row_key`; None: copied one by one)."""
        groups: dict[tuple[Any, ...] | None, list[str]] = {}
        for name in names:
            key = None if name in self._dists else row_key(payload[name])
            groups.setdefault(key, []).append(name)
        return groups
