"""A framework's worker call as a phase of its role, on the rank that runs it.

RL frameworks drive their workers with calls the driver makes on every rank of a role
(verl's ``compute_log_prob``, ``update_actor``...). :func:`as_phase` wraps such a method so
that each call runs inside ``producer.phase("{role}/{phase}", step=...)``
(``rlpulse.producer.phase``): host and GPU time, memory snapshots, a span for timelines and
``straggler/...``. Which producer, phase and step a call is, the integration says per call
with ``describe`` (from the call's arguments: a step carried in the batch, the worker's rank);
None leaves the call unmeasured.

* A call made while another wrapped call's phase is open in the same context (one worker
  method calling another: verl's ``update_actor`` calls its ``train_mini_batch``) is not a phase
  of its own; the outer call is the phase.
* Plain and ``async def`` methods alike; the wrapper keeps the method's name, qualified name,
  module, docstring and attributes (``functools.wraps``: a framework's dispatch attributes,
  verl's ``@register``, stay on it). So cloudpickle pickles a wrapped method by reference
  (its qualified name finds it), which matters on Ray: ``ray.remote(cls)`` copies the class's
  methods in the process that calls it, and the copy reaches the actor's process by pickle;
  by reference, it is the wrapper installed there, with that process's producers.
* A framework that loads and unloads model state inside the call times it with
  :func:`load` (``with load("onload"): ...``): the open phase's ``part``, nothing otherwise.
* Nothing here raises into the call: an error of ``describe`` is warned about once per
  wrapped method and the call runs unmeasured; the phase itself never raises (the call's own
  exception propagates unchanged).

A framework whose calls do not all carry their step (ROLL's weight update, an offload at the
start of a step) keeps the step a worker process is in with a :class:`StepClock`: a call that
carries the step sets it, the driver saying a step is over (:meth:`StepClock.finished`) moves
it to the next, and before any step is known a call is no phase (``describe`` gives None).

>>> def double(x):
...     return 2 * x
>>> timed = as_phase(double, lambda x: None)  # describe: never a phase
>>> timed(3), current() is None
(6, True)
>>> clock = StepClock(start=0)
>>> clock.step_for(None), clock.step_for(3), clock.step_for(None)
(0, 3, 3)
>>> clock.finished(3); clock.step_for(None)
4
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from rlpulse.producer.phase import Phase

log = logging.getLogger("rlpulse.integrations.phases")

F = TypeVar("F", bound=Callable[..., Any])


class PhaseSource(Protocol):
    """What opens a phase: a ``Producer`` (or a recorder in tests)."""

    def phase(self, infix: str, *, step: int) -> Phase: ...


@dataclass(frozen=True)
class Call:
    """One worker call as a phase: ``producer.phase(infix, step=step)``."""

    producer: PhaseSource
    infix: str
    """``{role}/{phase}``, a phase of the catalog's ``topology.PHASES``."""
    step: int


Describe = Callable[..., "Call | None"]
"""Called with the wrapped method's arguments (``self`` first for a method): the call's phase,
or None to run it unmeasured."""

MARK = "_rlpulse_phase_of"
"""The attribute that marks a wrapped method (so it is never wrapped twice). True, not the
original: a wrapper keeps the original's qualified name, so the original pickled by reference
would find the wrapper again, and pickling a wrapper that holds it would never end (Ray)."""

_CURRENT: contextvars.ContextVar[Phase | None] = contextvars.ContextVar(
    "rlpulse_worker_phase", default=None
)
_warned: set[str] = set()


class StepClock:
    """The step of a worker process (see the module docstring). Thread-safe."""

    def __init__(self, start: int | None = None) -> None:
        self._current = start
        self._lock = threading.Lock()
        self.counts = {"phases": 0, "unstepped": 0}
        """Calls a ``describe`` made phases, and calls before any step was known."""

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


def current() -> Phase | None:
    """The phase of the wrapped call running in this context, if any."""
    return _CURRENT.get()


@contextmanager
def load(kind: str) -> Iterator[None]:
    """Time an ``onload`` or ``offload`` the framework does inside a wrapped call as that
    phase's (``Phase.part``); outside one, or on a phase not measured, just run the block."""
    phase = _CURRENT.get()
    if phase is None:
        yield
        return
    with phase.part(kind):
        yield


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning("rlpulse: %s", message)


def _call(describe: Describe, name: str, args: Any, kwargs: Any) -> Call | None:
    if _CURRENT.get() is not None:  # inside another wrapped call: that one is the phase
        return None
    try:
        return describe(*args, **kwargs)
    except Exception as exc:  # never into the worker's call
        _warn_once(f"describe:{name}", f"{name} runs without its phase: {exc!r}")
        return None


def _entered(call: Call, name: str) -> Phase | None:
    """``call``'s phase, entered; None (warned once) when the producer cannot open it."""
    try:
        phase = call.producer.phase(call.infix, step=call.step)
        phase.__enter__()
        return phase
    except Exception as exc:  # never into the worker's call
        _warn_once(f"phase:{name}", f"{name} runs without its phase: {exc!r}")
        return None


def _exit(phase: Phase, name: str, exc: BaseException | None) -> None:
    try:
        phase.__exit__(type(exc) if exc is not None else None, exc, None)
    except Exception as err:  # never into the worker's call
        _warn_once(f"exit:{name}", f"{name}'s phase was not sent: {err!r}")


def as_phase(method: F, describe: Describe) -> F:
    """``method`` (plain or ``async``), each call timed as the phase ``describe`` gives.

    >>> # ActorWorker.update = as_phase(ActorWorker.update, lambda self, batch: Call(
    >>> #     self.producer, "actor/train_step", batch.step))
    """
    name = getattr(method, "__qualname__", repr(method))
    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def async_phase(*args: Any, **kwargs: Any) -> Any:
            call = _call(describe, name, args, kwargs)
            phase = None if call is None else _entered(call, name)
            if phase is None:
                return await method(*args, **kwargs)
            token = _CURRENT.set(phase)
            try:
                result = await method(*args, **kwargs)
            except BaseException as exc:
                _exit(phase, name, exc)
                raise
            finally:
                _CURRENT.reset(token)
            _exit(phase, name, None)
            return result

        setattr(async_phase, MARK, True)
        return async_phase  # type: ignore[return-value]

    @functools.wraps(method)
    def in_phase(*args: Any, **kwargs: Any) -> Any:
        call = _call(describe, name, args, kwargs)
        phase = None if call is None else _entered(call, name)
        if phase is None:
            return method(*args, **kwargs)
        token = _CURRENT.set(phase)
        try:
            result = method(*args, **kwargs)
        except BaseException as exc:
            _exit(phase, name, exc)
            raise
        finally:
            _CURRENT.reset(token)
        _exit(phase, name, None)
        return result

    setattr(in_phase, MARK, True)
    return in_phase  # type: ignore[return-value]
