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

>>> def double(x):
...     return 2 * x
>>> timed = as_phase(double, lambda x: None)  # describe: never a phase
>>> timed(3), current() is None
(6, True)
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
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

_CURRENT: contextvars.ContextVar[Phase | None] = contextvars.ContextVar(
    "rlpulse_worker_phase", default=None
)
_warned: set[str] = set()


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

    return in_phase  # type: ignore[return-value]
