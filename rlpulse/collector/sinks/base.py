"""The protocol every sink implements, and what the collector hands a sink at start-up.

A sink is one class in one file under ``collector/sinks/``. The collector builds it with
``from_kwargs(kwargs, ctx)`` at start-up (where bad kwargs raise :class:`ConfigError` naming the
field, and a missing optional library raises one with the install hint), calls ``open()`` once,
``write(record)`` for every emitted step in order, and ``close()`` once; ``forget(run)`` when the collector forgets a run that ended (its state
of the run may go), ``reopen()`` on SIGHUP (its files, renamed by a log rotation, are opened
again at their paths: :func:`renamed`). Each sink runs on its
own worker thread (``rlpulse.collector.output.fanout``), so a slow sink delays nobody else; a sink may block
and may raise, and the fan-out retries and counts its failures.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from rlpulse.collector.env import Setting
from rlpulse.schemas.catalog import Catalog
from rlpulse.schemas.errors import ConfigError
from rlpulse.schemas.metrics import CATALOG
from rlpulse.schemas.record import StepRecord

if TYPE_CHECKING:  # a sink is handed the targets; it needs no discovery code
    from rlpulse.collector.output.discovery import ScrapeTarget


def _no_health() -> Mapping[str, float]:
    return {}


def _no_targets() -> Sequence[ScrapeTarget]:
    return ()


@dataclass(frozen=True)
class SinkContext:
    """What a sink may use besides its kwargs.

    ``health`` returns a snapshot of the collector's own counters; ``scrape_targets`` the
    registered metrics endpoints (``rlpulse.collector.output.discovery``), from any thread; ``defaults`` are
    settings taken from outside the YAML, by the sink's own kwarg names (the environment
    variables a sink class lists in ``ENV``, read by ``rlpulse.collector.env``, never by the sink).
    """

    catalog: Catalog = CATALOG
    health: Callable[[], Mapping[str, Any]] = _no_health
    scrape_targets: Callable[[], Sequence[ScrapeTarget]] = _no_targets
    defaults: Mapping[str, Setting] = field(default_factory=dict)


RENAME_CHECK_S = 1.0
"""How often, at most, a sink asks whether its file was renamed (:class:`RenameCheck`)."""


class RenameCheck:
    """Whether a sink's file was renamed (a log rotation that sent no SIGHUP), asked at most
    every ``RENAME_CHECK_S`` while steps are written: a ``stat`` and ``fstat`` per step cost
    10 to 25 µs on the loaded 2-core build machine, a third of a jsonl line's own write.
    Steps written in the meantime go to the renamed file: each is in one file all the same.

    >>> RenameCheck(clock=lambda: 5.0).due()
    True
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._next = -math.inf

    def due(self) -> bool:
        now = self._clock()
        if now < self._next:
            return False
        self._next = now + RENAME_CHECK_S
        return True


def renamed(path: Path, fd: int) -> bool:
    """Whether ``path`` no longer names the open file ``fd`` (renamed or removed: a log
    rotation)."""
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False  # unreadable now: keep writing where we are
    held = os.fstat(fd)
    return (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino)


def reject_unknown(kwargs: Mapping[str, Any], allowed: tuple[str, ...], field: str) -> None:
    """Fail at start-up on a tracker kwarg the sink does not take, naming it."""
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise ConfigError(
            f"{field}.{unknown[0]}", f"unknown option; expected one of {', '.join(allowed)}"
        )


def required_path(kwargs: Mapping[str, Any], key: str, field: str, what: str) -> str:
    """The path a sink cannot run without, ``kwargs[key]``; a ConfigError naming
    ``field.key`` and saying ``what`` it is for when it is missing or empty."""
    value = kwargs.get(key)
    if not isinstance(value, str | os.PathLike) or not str(value):
        raise ConfigError(f"{field}.{key}", f"is required: {what}", value)
    return str(value)


class Sink(Protocol):
    """A destination for aggregated steps. Sinks subclass it (for ``written_through``'s
    default) and list in ``ENV`` the environment variables that set their kwargs."""

    name: str
    ENV: ClassVar[Mapping[str, str]] = {}
    """Kwarg name -> environment variable used when the kwarg is not given."""
    PATHS: ClassVar[tuple[str, ...]] = ()
    """Kwargs that are file-system paths (a relative one may be placed under a run's
    directory: ``CollectorConfig.placed_under``)."""

    def open(self) -> None: ...

    def write(self, record: StepRecord) -> None: ...

    def close(self) -> None: ...

    def forget(self, run: str) -> None:
        """The collector forgot ``run`` (``run_retention_s`` after it ended): let go of what
        is kept of it (open files, series, tracker runs). No step of it follows, unless the
        run is resumed (then it is a run like any other). Sinks that keep nothing per run
        need not implement it."""
        return None

    def reopen(self) -> None:
        """Reopen the files this sink writes at their configured paths (SIGHUP, after a log
        rotation renamed them); called on the sink's own thread between two steps, so a step
        is in one file only. Sinks that write no file a user rotates need not implement it."""
        return None

    def written_through(self) -> Mapping[str, int]:
        """Per run, the last step this sink's own output already holds, read back at start-up
        (with ``state_dir``, so a crash between a write and its cursor update does not
        duplicate a step). Sinks that cannot read their output back hold nothing."""
        return {}
