"""The rollout engine's metrics per training step when the engine is a server: scrape every
engine's ``/metrics`` at the two ends of the step's rollout, and log what changed.

``EngineWatch(producer, urls)`` is called by the process that drives the rollout, around it:
``begin(step)`` just before the step's first request goes out, ``end(step)`` just after its
last response came back (``with watch.window(step):`` does both). ``end`` logs, through
``producer``, the step's ``rollout/engine/...`` under the names the in-process path uses
(``rlpulse.producer.vllm_stats``), merged exactly over the engines
(:mod:`rlpulse.producer.engines`): counters as their change between the two scrapes (tokens,
requests and requests by finish reason, preemptions, prefix-cache queries and hits),
histograms as their change per bucket (time to first token, inter-token latency, end-to-end
and queue time), gauges (KV-cache use, running and waiting requests) as their largest scraped
value, plus ``rollout/engine/servers`` and ``rollout/engine/servers_unread``.

**The window.** A step's numbers are what the engines did between the two scrapes, whoever
asked: they equal what the step's requests received when nothing else reaches the engines in
between (validation requests sent inside the window count with it, as in the in-process path).
The TRL callback and verl's legacy trainer place the window around the driver's generation
call; a rollout that is dispatched without waiting for it (verl's v1 trainers) has windows
from one dispatch to the next (:meth:`EngineWatch.next`: one scrape ends a window and begins
the next, so consecutive windows tile time), the last one ended when the step is logged
(:meth:`EngineWatch.end_open`). When generation overlaps training (an asynchronous pipeline),
windows are still by time: requests of the next step that reach the engines before this
step's window ends count here, and requests sent outside any window count nowhere. Windows
never overlap: ``begin`` while a window is open ends that one first.

**Gauges** are instants: a scrape sees the value at that moment. Their maximum is taken over
the scrapes at both ends and one every ``poll_s`` while the window is open (a background
thread), so it is a lower bound of the true peak: a peak shorter than ``poll_s`` can fall
between two scrapes. (The in-process path sees every engine iteration.)

**Faults.** Scrapes run on a small thread pool; ``begin`` and ``end`` wait for theirs at most
``timeout_s``. An engine that does not answer in time, refuses, or serves text that cannot be
read is left out of the step (``rollout/engine/servers_unread``), counted in :meth:`stats` and
warned once; it is then *down*: boundary scrapes stop waiting for it, and the background
thread retries it every ``poll_s`` until it answers, so a dead engine costs training one
``timeout_s`` at most. Nothing here raises into the caller after construction; bad URLs and
settings raise :class:`~rlpulse.schemas.errors.ConfigError` there.

>>> # watch = EngineWatch(producer, ["http://10.0.0.7:8000/metrics"])
>>> # with watch.window(step): outputs = generate(prompts)
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from rlpulse.producer.engines import Reading, Window, difference, merge
from rlpulse.producer.enginescrape import Fetch, Scraper, checked_urls, fetch_text
from rlpulse.producer.env import ENGINES_VAR, engines_from_env, engines_timeout_from_env
from rlpulse.schemas import engine as E
from rlpulse.schemas.errors import ConfigError

log = logging.getLogger("rlpulse.producer.engines")


class Logs(Protocol):
    """What the watch logs through: a :class:`~rlpulse.producer.client.Producer`."""

    def log(self, data: Mapping[str, Any], step: int) -> None: ...


@dataclass(frozen=True)
class EngineWatchConfig:
    """How engines are scraped.

    * ``timeout_s``: the longest ``begin``/``end`` wait for a scrape (and each HTTP request's
      timeout);
    * ``poll_s``: how often the gauges are scraped while a window is open, and a down engine
      retried;
    * ``max_bytes``: the largest ``/metrics`` answer read (vLLM's is some 50 KB);
    * ``workers``: scrapes running at once.

    >>> EngineWatchConfig(timeout_s=0)
    Traceback (most recent call last):
    ...
    rlpulse.schemas.errors.ConfigError: timeout_s: must be a positive number of seconds (got 0)
    """

    timeout_s: float = 5.0
    poll_s: float = 1.0
    max_bytes: int = 16 << 20
    workers: int = 8

    def __post_init__(self) -> None:
        for name in ("timeout_s", "poll_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not (math.isfinite(value) and value > 0):
                raise ConfigError(name, "must be a positive number of seconds", value)
        for name in ("max_bytes", "workers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(name, "must be a positive integer", value)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> EngineWatchConfig:
        """The defaults, with ``RLPULSE_ENGINES_TIMEOUT_S`` for ``timeout_s`` when set."""
        timeout = engines_timeout_from_env(environ)
        return cls() if timeout is None else cls(timeout_s=timeout)


@dataclass
class _Open:
    """The window now open: its step, its engines and their readings at its begin (and the
    gauges' peaks since)."""

    step: int
    watched: tuple[str, ...]
    start: dict[str, Reading]
    peaks: dict[str, Reading] = field(default_factory=dict)


class EngineWatch:
    """Scrapes engine servers around each step's rollout and logs their metrics (see the
    module docstring). ``urls``: the engines' ``/metrics`` URLs, and those of
    ``RLPULSE_ENGINES`` (:func:`~rlpulse.producer.env.engines_from_env`) with ``environ``;
    :meth:`add` more later. ``config`` defaults to :meth:`EngineWatchConfig.from_env`.
    ``fetch`` (how a URL is read) is for tests.

    >>> from rlpulse.producer import NullProducer
    >>> watch = EngineWatch(NullProducer(), [], environ={})
    >>> watch.begin(1); watch.end(1)   # no engines: nothing to log
    >>> watch.close()
    """

    def __init__(
        self,
        producer: Logs,
        urls: Iterable[str] = (),
        *,
        config: EngineWatchConfig | None = None,
        environ: Mapping[str, str] = os.environ,
        fetch: Fetch = fetch_text,
    ) -> None:
        self.producer = producer
        self.config = config if config is not None else EngineWatchConfig.from_env(environ)
        given = checked_urls(urls, "urls")
        named = checked_urls(engines_from_env(environ), ENGINES_VAR)
        self._urls = given + tuple(u for u in named if u not in given)
        self._lock = threading.Lock()
        self._open: _Open | None = None
        self._poller: threading.Thread | None = None
        self._closed = threading.Event()
        self._warned: set[str] = set()
        self._stats = dict.fromkeys(
            ("windows", "logged", "resets", "rebinned", "misuse", "errors"), 0
        )
        self._scraper = Scraper(
            self.config.timeout_s,
            self.config.max_bytes,
            self.config.workers,
            fetch=fetch,
            warn=self._warn,
        )

    # ------------------------------------------------------------------ the caller's side

    @property
    def urls(self) -> tuple[str, ...]:
        """The engines watched."""
        return self._urls

    def add(self, urls: Iterable[str]) -> None:
        """Watch these engines too (from the next window on); ConfigError for a bad URL."""
        new = checked_urls(urls, "urls")
        with self._lock:
            self._urls += tuple(u for u in new if u not in self._urls)

    def begin(self, step: int) -> None:
        """The step's rollout starts now: scrape every engine (waiting ``timeout_s`` at most)."""
        try:
            if self._open is not None:
                self._misuse(
                    "begin",
                    f"begin({step}) while step {self._open.step}'s window is "
                    "open: that window ends first",
                )
                self.end(self._open.step)
            with self._lock:
                watched = self._urls
            down = self._scraper.down(watched)
            self._start_poller()
            start = self._scraper.scrape(u for u in watched if u not in down)
            with self._lock:
                self._open = _Open(step, watched, start)
        except Exception as exc:  # never into the training loop
            self._error("begin", exc)

    def end(self, step: int) -> dict[str, Any] | None:
        """The step's rollout is over: scrape again, log the step's engine metrics, and return
        them (None when no window was open or no engine was watched)."""
        try:
            with self._lock:
                opened, self._open = self._open, None
            if opened is None:
                self._misuse("end", f"end({step}) with no window open: nothing logged")
                return None
            if opened.step != step:
                self._misuse(
                    "step",
                    f"end({step}) closes the window begun at step "
                    f"{opened.step}: logged at {opened.step}",
                )
            return self._finish(opened)
        except Exception as exc:
            self._error("end", exc)
            return None

    def next(self, step: int) -> dict[str, Any] | None:
        """End the open window, if any, and begin one at ``step``, both at one scrape: for a
        rollout that is dispatched without waiting (verl's v1 trainers), whose windows run from
        one dispatch to the next. The ended window's metrics, as :meth:`end` returns them."""
        try:
            with self._lock:
                opened, self._open = self._open, None
                watched = self._urls
            down = self._scraper.down(watched)
            self._start_poller()
            ask = [u for u in watched if u not in down]
            if opened is not None:
                ask += [u for u in opened.start if u not in ask]
            readings = self._scraper.scrape(ask)
            ended = self._finish(opened, readings) if opened is not None else None
            start = {u: readings[u] for u in watched if u in readings and u not in down}
            with self._lock:
                self._open = _Open(step, watched, start)
            return ended
        except Exception as exc:
            self._error("next", exc)
            return None

    def end_open(self) -> dict[str, Any] | None:
        """End the open window at its own step, if one is open (nothing to say otherwise)."""
        with self._lock:
            opened = self._open
        return None if opened is None else self.end(opened.step)

    @contextmanager
    def window(self, step: int) -> Iterator[None]:
        """``begin(step)``, the block, ``end(step)`` (also when the block raises)."""
        self.begin(step)
        try:
            yield
        finally:
            self.end(step)

    def stats(self) -> dict[str, int]:
        """Counts since start: ``windows`` ended, ``logged`` steps, ``scrapes`` and their
        ``scrape_failures`` (refused, HTTP error), ``scrape_timeouts``, ``unreadable`` texts,
        ``no_vllm_metrics`` (an answer without vLLM's metrics), ``resets`` (an engine
        restarted inside a window), ``rebinned`` (a histogram on buckets the catalog lacks),
        ``misuse`` (end without begin...) and internal ``errors``."""
        with self._lock:
            return {**self._scraper.stats(), **self._stats}

    def close(self) -> None:
        """Stop the background thread and the scrapes (safe to call twice); an open window
        is dropped, not logged."""
        self._closed.set()
        poller, self._poller = self._poller, None
        if poller is not None:
            poller.join(self.config.timeout_s + 1.0)
        self._scraper.close()

    # ------------------------------------------------------------------ inside

    def _finish(
        self, opened: _Open, final: Mapping[str, Reading] | None = None
    ) -> dict[str, Any] | None:
        """Log the window ``opened`` ended at the readings ``final`` (scraped now if None)."""
        urls = list(opened.start)
        unread = len(opened.watched) - len(urls)
        if not opened.watched:
            return None
        if final is None:
            final = self._scraper.scrape(urls)
        windows: list[Window] = []
        for url in urls:
            after = final.get(url)
            if after is None:
                unread += 1
                continue
            w = difference(opened.start[url], after)
            peaks = opened.peaks.get(url)
            if peaks is not None:
                w.peak(peaks)
            windows.append(w)
        merged = merge(windows)
        metrics = merged.metrics() if windows else {E.ENGINE_SERVERS.name: 0}
        metrics[E.ENGINE_SERVERS_UNREAD.name] = unread
        with self._lock:
            self._stats["windows"] += 1
            self._stats["resets"] += merged.resets
        if merged.resets:
            self._warn(
                "reset",
                f"an engine restarted during step {opened.step}'s rollout: "
                "its numbers count from the restart",
            )
        for family in merged.rebinned:
            with self._lock:
                self._stats["rebinned"] += 1
            self._warn(
                f"rebinned:{family}",
                f"{family} has bucket bounds the catalog lacks "
                "(custom buckets?): its counts land in the catalog bucket above, exact "
                "in number, coarser in quantiles",
            )
        self.producer.log(metrics, opened.step)
        with self._lock:
            self._stats["logged"] += 1
        return metrics

    def _start_poller(self) -> None:
        if self._poller is None and not self._closed.is_set():
            self._poller = threading.Thread(
                target=self._poll, name="rlpulse-engines-poll", daemon=True
            )
            self._poller.start()

    def _poll(self) -> None:
        """While a window is open, scrape its engines every ``poll_s`` for the gauges' peaks;
        always retry the engines that are down."""
        while not self._closed.wait(self.config.poll_s):
            try:
                with self._lock:
                    opened, watched = self._open, self._urls
                urls = list(opened.start) if opened is not None else []
                down = [u for u in self._scraper.down(watched) if u not in urls]
                readings = self._scraper.scrape([*urls, *down])
                if opened is None:
                    continue
                with self._lock:
                    if self._open is not opened:
                        continue
                    for url in urls:
                        if url in readings:
                            peak = opened.peaks.get(url)
                            opened.peaks[url] = _higher(peak, readings[url])
            except Exception as exc:
                self._error("poll", exc)

    def _misuse(self, key: str, message: str) -> None:
        with self._lock:
            self._stats["misuse"] += 1
        self._warn(f"misuse:{key}", message)

    def _error(self, where: str, exc: BaseException) -> None:
        with self._lock:
            self._stats["errors"] += 1
        self._warn(
            f"error:{where}", f"engine metrics: {where} failed ({exc!r:.200}); counted in stats()"
        )

    def _warn(self, key: str, message: str) -> None:
        with self._lock:
            if key in self._warned:
                return
            self._warned.add(key)
        log.warning("rlpulse: %s", message)


def _higher(peak: Reading | None, reading: Reading) -> Reading:
    """A reading whose gauges are the larger of ``peak``'s and ``reading``'s."""
    gauges = dict(reading.gauges)
    if peak is not None:
        for name, value in peak.gauges.items():
            gauges[name] = max(gauges.get(name, value), value)
    return Reading(gauges=gauges)
