"""Logging that cannot flood: at most one line per key per interval, with a suppressed count."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable


class RateLimitedLog:
    """``warn(key, msg)`` logs the first occurrence of ``key`` and then at most once per
    ``interval_s``, saying how many were suppressed in between.

    >>> r = RateLimitedLog(logging.getLogger("x"), interval_s=60, clock=lambda: 0.0)
    >>> r.warn("bad", "first"); r.warn("bad", "second")  # the second is suppressed
    """

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 1024,
    ) -> None:
        self._logger = logger
        self._interval = interval_s
        self._clock = clock
        self._max_keys = max_keys
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warn(self, key: str, message: str) -> None:
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self._interval:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return
        if last is None and len(self._last) >= self._max_keys:
            key = "<other>"
        skipped = self._suppressed.pop(key, 0)
        self._last[key] = now
        suffix = f" ({skipped} similar suppressed)" if skipped else ""
        self._logger.warning("%s%s", message, suffix)
