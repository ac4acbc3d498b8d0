"""A framework's worker call as a phase of its own rank, for any framework that calls Ray
workers: time (and memory, GPU time on a GPU) of every call, logged by the worker's own
producer, so the collector sees each rank's phase (timelines, ``straggler/...``) where the
framework averages phase times over ranks.

Two pieces, both framework-agnostic:

* :class:`StepClock`: the step a worker process is in. A call that carries the step sets it;
  the driver saying a step is over (:meth:`StepClock.finished`) moves it to the next, so a
  call that carries none (a weight update, an offload at the start of a step) lands in the
  right step. Before any step is known, calls are not phases (counted).
* :func:`as_phase`: a method wrapped so that each call runs inside
  ``producer.phase(infix, step=...)`` (sync and ``async`` methods). What producer and which
  step are asked of the caller's functions, and whatever they raise is counted and swallowed:
  the call itself runs unchanged, its result and its exceptions are the method's.

>>> clock = StepClock(start=0)
>>> clock.step_for(None), clock.step_for(3), clock.step_for(None)
(0, 3, 3)
>>> clock.finished(3); clock.step_for(None)
4
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

log = logging.getLogger("rlpulse.integrations.phases")


class PhaseProducer(Protocol):
    """What a phase needs of a producer (``rlpulse.producer.Producer``)."""

    def phase(self, infix: str, *, step: int) -> Any: ...


class StepClock:
    """The step of a worker process (see the module docstring). Thread-safe."""

    def __init__(self, start: int | None = None) -> None:
        self._current = start
        self._lock = threading.Lock()
        self.counts = {"phases": 0, "unstepped": 0, "failed": 0}

    @property
    def current(self) -> int | None:
        return self._current

    def step_for(self, explicit: int | None) -> int | None:
        """The step of a call: ``explicit`` (which also moves the clock forward), else the
        current one; None before any is known."""
        with self._lock:
            if explicit is None:
                return self._current
            if self._current is None or explicit > self._current:
                self._current = explicit
            return explicit

    def finished(self, step: int) -> None:
        """The driver says ``step`` is over: calls without a step now belong to the next."""
        with self._lock:
            if self._current is None or self._current <= step:
                self._current = step + 1

    def start(self, step: int) -> None:
        """The first step, where the worker knows it before any call carries it."""
        with self._lock:
            if self._current is None:
                self._current = step


def as_phase(
    method: Callable[..., Any],
    name: str,
    producer_for: Callable[[Any], PhaseProducer | None],
    clock: StepClock,
    step_of: Callable[[tuple[Any, ...], dict[str, Any]], int | None],
    infix_of: Callable[[Any, str], str | None],
) -> Callable[..., Any]:
    """``method`` (of a worker class), each call a phase ``infix_of(worker, name)`` of the
    worker's producer ``producer_for(worker)`` at the call's step: ``step_of(args, kwargs)``
    (the call's arguments after ``self``), else the clock's. No phase (the call runs bare)
    when any of them gives None."""

    def enter(self: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            producer = producer_for(self)  # first: making it may start the clock
            infix = infix_of(self, name) if producer is not None else None
            if producer is None or infix is None:
                return None
            step = clock.step_for(step_of(args, kwargs))
            if step is None:
                clock.counts["unstepped"] += 1
                return None
            phase = producer.phase(infix, step=step)
            phase.__enter__()
            clock.counts["phases"] += 1
            return phase
        except Exception as exc:  # never into the framework's call
            _failed(clock, name, exc)
            return None

    def leave(phase: Any, exc: BaseException | None) -> None:
        if phase is None:
            return
        try:
            phase.__exit__(type(exc) if exc else None, exc, exc.__traceback__ if exc else None)
        except Exception as err:
            _failed(clock, name, err)

    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def call_async(self: Any, *args: Any, **kwargs: Any) -> Any:
            phase = enter(self, args, kwargs)
            try:
                result = await method(self, *args, **kwargs)
            except BaseException as exc:
                leave(phase, exc)
                raise
            leave(phase, None)
            return result

        setattr(call_async, MARK, method)
        return call_async

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        phase = enter(self, args, kwargs)
        try:
            result = method(self, *args, **kwargs)
        except BaseException as exc:
            leave(phase, exc)
            raise
        leave(phase, None)
        return result

    setattr(call, MARK, method)
    return call


MARK = "_rlpulse_phase_of"
"""The attribute a wrapped method keeps its original under (so it is never wrapped twice)."""


_warned: set[str] = set()


def _failed(clock: StepClock, name: str, exc: BaseException) -> None:
    clock.counts["failed"] += 1
    if name not in _warned:
        _warned.add(name)
        log.warning("rlpulse: the %s call was not measured as a phase: %r", name, exc)
