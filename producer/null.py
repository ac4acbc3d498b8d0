"""``NullProducer``: the Producer's calls with no metrics, for runs with metrics turned off
(and for measuring what metrics cost). ``phase()`` still runs onload and offload: they are the
training's own work, not measurement."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from schemas.protocol import STAT_KEYS


class NullProducer:
    """Accepts every Producer call and sends nothing.

    >>> p = NullProducer()
    >>> p.log({"actor/pg_loss": 0.1}, step=0); p.close()
    """

    def log(self, data: Mapping[str, Any], step: int) -> None:
        pass

    @contextmanager
    def phase(
        self,
        infix: str,
        *,
        step: int,
        onload: Callable[[], object] | None = None,
        offload: Callable[[], object] | None = None,
    ) -> Iterator[None]:
        if onload is not None:
            onload()
        try:
            yield
        finally:
            if offload is not None:
                offload()

    def step_done(self, step: int) -> None:
        pass

    def flush(self, timeout: float = 5.0) -> bool:
        return True

    def close(self, timeout: float | None = None) -> None:
        pass

    def stats(self) -> dict[str, int]:
        return dict.fromkeys(STAT_KEYS, 0)

    def __enter__(self) -> NullProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        pass
