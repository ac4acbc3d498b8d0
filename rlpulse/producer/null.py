"""``NullProducer``: the Producer's calls with no metrics, for runs with metrics turned off
(and for measuring what metrics cost). ``phase()`` still runs onload and offload: they are the
training's own work, not measurement."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Concatenate, ParamSpec, SupportsIndex

from rlpulse.producer.client import Producer
from rlpulse.producer.config import FLUSH_TIMEOUT_S
from rlpulse.schemas.protocol import STAT_KEYS

_P = ParamSpec("_P")


def _takes_arguments_of(
    original: Callable[Concatenate[Any, _P], None],
) -> Callable[[Callable[[Any, Mapping[str, Any]], None]], Callable[Concatenate[Any, _P], None]]:
    """Give an ``__init__`` that needs nothing the parameters of ``original``: to a type
    checker, the very same signature; at run time, arguments bound against it, so a name
    ``original`` does not take fails with the same TypeError. Every argument may be left out
    (``bind_partial``); ``init`` gets them by name, as bound."""

    def decorate(
        init: Callable[[Any, Mapping[str, Any]], None],
    ) -> Callable[Concatenate[Any, _P], None]:
        signature = inspect.signature(original)

        @functools.wraps(init)
        def checked(self: Any, *args: _P.args, **kwargs: _P.kwargs) -> None:
            init(self, signature.bind_partial(self, *args, **kwargs).arguments)

        checked.__signature__ = signature  # type: ignore[attr-defined]  # help() and inspect
        return checked

    return decorate


class NullPhase:
    """What ``NullProducer.phase`` yields: ``Phase.add`` that keeps nothing."""

    def add(self, data: Mapping[str, Any]) -> None:
        pass


class NullProducer:
    """Accepts every Producer call, and Producer's constructor arguments, and sends nothing:
    ``NullProducer(address, run=..., role=..., rank=...)`` swaps in for ``Producer`` as is.

    >>> p = NullProducer("tcp://127.0.0.1:5555", run="r1", role="actor_train", world_size=2)
    >>> p.log({"actor/pg_loss": 0.1}, step=0); p.close()
    """

    @_takes_arguments_of(Producer.__init__)
    def __init__(self, given: Mapping[str, Any]) -> None:
        self.run: str = given.get("run", "")

    def log(self, data: Mapping[str, Any], step: SupportsIndex) -> None:
        pass

    def run_config(self, config: Mapping[str, Any]) -> bool:
        return False  # nothing is sent

    @contextmanager
    def phase(
        self,
        infix: str,
        *,
        step: SupportsIndex,
        onload: Callable[[], object] | None = None,
        offload: Callable[[], object] | None = None,
    ) -> Iterator[NullPhase]:
        if onload is not None:
            onload()
        try:
            yield NullPhase()
        finally:
            if offload is not None:
                offload()

    def step_done(self, step: SupportsIndex) -> None:
        pass

    def flush(self, timeout: float = FLUSH_TIMEOUT_S) -> bool:
        return True

    def close(self, timeout: float | None = None) -> None:
        pass

    @property
    def recorded_run(self) -> str:
        return self.run

    def stats(self) -> dict[str, int]:
        return dict.fromkeys(STAT_KEYS, 0)

    def __enter__(self) -> NullProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        pass
