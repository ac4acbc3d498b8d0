"""What the caller's thread hands the sender thread, and how it wakes it.

The items ``log()``, ``step_done()`` and ``flush()`` queue (:class:`Call`, :class:`Done`,
:class:`Flush`: a plain ``deque`` of them, in order) and the two primitives the threads
share: :class:`Wake`, the sender's wake-up, and :class:`CallerFirst`, the training thread's
right of way while ``log()`` runs. Nothing here touches a socket or a value.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from typing import NamedTuple

from rlpulse.producer.deferred import Pending


class Wake:
    """The sender's wake-up, with ``threading.Event``'s interface on a ``SimpleQueue``:
    waiting on it takes one C lock, where an Event's wait builds and juggles Python locks
    (a third of the cost of an idle sender's wake-up). ``set`` queues a token only when
    not set already; a token left by a ``set`` that no ``wait`` took makes one spurious,
    harmless wake-up.

    >>> w = Wake(); w.set(); w.wait(1.0), w.is_set()
    (True, True)
    """

    __slots__ = ("_flag", "_tokens")

    def __init__(self) -> None:
        self._tokens: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._flag = False

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        if not self._flag:
            self._flag = True
            self._tokens.put(None)

    def clear(self) -> None:
        self._flag = False

    def wait(self, timeout: float) -> bool:
        """True once set (now, or within ``timeout`` seconds)."""
        if self._flag:  # set already: its token, if still queued, is spent here
            with contextlib.suppress(queue.Empty):
                self._tokens.get_nowait()
            return True
        try:
            self._tokens.get(timeout=timeout)
        except queue.Empty:
            return self._flag
        return True


class CallerFirst:
    """The training thread's right of way. Torch ops and numpy copies in ``log()`` let go
    of the GIL while they work; the sender thread takes it then, and ``log()`` gets it back
    only when the sender next lets go (a socket call, a sleep) or after the interpreter's
    switch interval (5 ms). So while ``log()`` runs (:meth:`enter`, :meth:`leave`), the
    sender waits between calls it encodes (:meth:`wait`): in a caller-cost probe the slowest
    2% of tensor steps waited 1.2-1.9 ms off the CPU without this; with it most ran on the
    CPU throughout, and one or two calls a run still waited 0.5-1.3 ms (a sender unit already
    under way when ``log()`` began, or the OS scheduling three busy threads on 2 cores).
    The wait is bounded (``rlpulse.producer.sender.YIELD_S`` a cycle), so ``log()`` in a tight loop cannot
    starve the sender. ``leave`` wakes a waiting sender (one ``SimpleQueue`` token); a token
    left over from a race makes one early, harmless wake-up.
    """

    __slots__ = ("_tokens", "_waiting", "busy")

    def __init__(self) -> None:
        self.busy = False
        self._waiting = False
        self._tokens: queue.SimpleQueue[None] = queue.SimpleQueue()

    def enter(self) -> None:
        self.busy = True

    def leave(self) -> None:
        self.busy = False
        if self._waiting:
            self._tokens.put(None)

    def wait(self, until: float) -> None:
        """In the sender: while ``log()`` runs, wait for it to end, not past ``until``
        (``time.monotonic()``)."""
        while self.busy:
            left = until - time.monotonic()
            if left <= 0:
                return
            self._waiting = True
            try:
                if self.busy:  # read after _waiting is set: leave() sees one or the other
                    self._tokens.get(timeout=left)
            except queue.Empty:
                return
            finally:
                self._waiting = False


class Call(NamedTuple):
    """A queued ``log()`` call: its step and wall time, its values by name (None once its GPU
    values are lost: then only ``step`` and ``time`` still count), the device work they wait
    for, whether it ends a phase (the sender then reads the GPUs), the bytes of host
    copies among its values (``rlpulse.producer.copies.Snapshot``: 0, none to reduce), the
    bytes of its ``Samples`` values (``rlpulse.producer.pending``), and whether ``log()``
    dropped some of its values unreduced (its step is then incomplete).

    >>> Call(7, time.time(), {"actor/pg_loss": 0.31}, (), False).step
    7
    """

    step: int
    time: float
    payload: dict | None
    waits: tuple[Pending, ...]
    phase_end: bool
    copied: int = 0
    pending: int = 0
    incomplete: bool = False


class Done(NamedTuple):
    """A queued ``step_done(step)``: this rank has finished every step up to ``step``.

    >>> Done(7).step
    7
    """

    step: int


class Flush(NamedTuple):
    """A queued ``flush()``: ``acked`` is set once everything queued before it is
    acknowledged (or the sender stops).

    >>> Flush(threading.Event()).acked.is_set()
    False
    """

    acked: threading.Event


Item = Call | Done | Flush
"""What the caller's thread queues for the sender, in order."""
