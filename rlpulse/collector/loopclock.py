"""The aggregator's clock in the daemon: time that counts against producers.

It is the raw monotonic clock less the collector's own pauses: it stands still while
``state_dir`` cannot be written (:meth:`LoopClock.stall` to :meth:`LoopClock.resume`, which
say so in the log and in ``rlpulse_collector_state_writable``), and
for what exceeds ``LOOP_GAP_S`` of a gap between two readings (a frozen collector: stopped
by SIGSTOP, a VM pause, swapped out, or too busy to read). Nothing is received then, so grace
periods and liveness must not run out for data that waits in the producers. Both are added
up in ``rlpulse_collector_paused_seconds_total``.

>>> t = [0.0]
>>> doc = logging.getLogger("doc")
>>> clock = LoopClock(lambda: t[0], Health(), RateLimitedLog(doc), doc)
>>> t[0] = 5.0
>>> clock.now()  # 4 s of the 5 were the collector's own gap
1.0
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from rlpulse.collector.health import Health
from rlpulse.collector.ratelog import RateLimitedLog

LOOP_GAP_S = 1.0
"""The most time between two readings of the clock that counts against producers; the main
loop waits at most ``POLL_MS`` between them. The rest of a longer gap is the collector's own."""


class LoopClock:
    """``raw`` (``time.monotonic``) less the pauses; read before every use (:meth:`now`), so
    a freeze is found before liveness is judged."""

    def __init__(
        self,
        raw: Callable[[], float],
        health: Health,
        warn: RateLimitedLog,
        log: logging.Logger,
    ) -> None:
        self.raw = raw
        self.health = health
        self._warn = warn
        self._log = log
        self._last_tick = raw()
        """The raw clock at the last reading (to find the loop's own gaps)."""
        self._paused_s = 0.0
        self._stalled_since: float | None = None
        """When writing ``state_dir`` started failing (None: it works)."""

    @property
    def stalled(self) -> bool:
        """``state_dir`` cannot be written: the clock stands still."""
        return self._stalled_since is not None

    def start(self) -> None:
        """The main loop starts: what came before (recovery, sinks opening) is no gap."""
        self._last_tick = self.raw()

    def now(self) -> float:
        raw = self.raw()
        gap, self._last_tick = raw - self._last_tick - LOOP_GAP_S, raw
        if self._stalled_since is not None:
            return self._stalled_since - self._paused_s  # already standing still
        if gap > 0:
            self._paused_s += gap
            self.health.paused_seconds = round(self._paused_s, 3)
            self._warn.warn(
                "gap",
                f"the collector did not run for {gap + LOOP_GAP_S:.1f}s (stopped, paused, "
                "swapped out or overloaded): not counted against producers' liveness or "
                "grace (rlpulse_collector_paused_seconds_total)",
            )
        return raw - self._paused_s

    def stall(self, where: Path, exc: OSError, unsaved: int, retry_s: float) -> None:
        """Writing ``state_dir`` (``where``) failed: stand still from now, and say so (an
        error the first time, then a reminder at most a minute)."""
        if self._stalled_since is not None:
            self._warn.warn(
                "still",
                f"{where} still cannot be written ({exc.strerror}); {unsaved} bytes wait to be "
                "written",
            )
            return
        self._stalled_since = self.raw()
        self.health.state_writable = 0
        self._log.error(
            "cannot write the state in %s (%s): receiving and acknowledging nothing until it "
            "can (producers keep their data meanwhile and resend it); retrying every %gs. See "
            "rlpulse_collector_state_writable and _disk_errors_total",
            where,
            exc,
            retry_s,
        )

    def resume(self, where: Path) -> None:
        """Writing ``where`` works again: go on from where the clock stood."""
        assert self._stalled_since is not None
        stalled = self.raw() - self._stalled_since
        self._paused_s += stalled
        self.health.paused_seconds = round(self._paused_s, 3)
        self._stalled_since = None
        self.health.state_writable = 1
        self._log.warning(
            "the state in %s can be written again after %.1fs; receiving and acknowledging",
            where,
            stalled,
        )
