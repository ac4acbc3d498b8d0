"""Scraping engine servers' ``/metrics`` for :mod:`rlpulse.producer.enginewatch`: on a small
thread pool, one scrape in flight per engine at most, the caller waiting a bounded time, and
engines that fail marked *down* (counted, warned once) until one of their scrapes answers in
time again.

>>> scraper = Scraper(timeout_s=1.0, max_bytes=1 << 20, workers=2)
>>> scraper.scrape([])   # nothing asked, nothing read
{}
>>> scraper.close()
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait

from rlpulse.producer.engines import ParseError, Reading, parse
from rlpulse.schemas.endpoint import MetricsUrl
from rlpulse.schemas.errors import ConfigError, SchemaError

log = logging.getLogger("rlpulse.producer.engines")

Fetch = Callable[[str, float, int], str]
"""``fetch(url, timeout_s, max_bytes)``: the text at ``url`` (raises on any failure)."""
STAT_KEYS = ("scrapes", "scrape_failures", "scrape_timeouts", "unreadable", "no_vllm_metrics")


def fetch_text(url: str, timeout_s: float, max_bytes: int) -> str:
    """GET ``url`` as Prometheus' text format, directly (no proxy from the environment: an
    engine's ``/metrics`` is an internal address, as for Prometheus)."""
    request = urllib.request.Request(url, headers={"Accept": "text/plain;version=0.0.4"})
    with _OPENER.open(request, timeout=timeout_s) as response:
        body = response.read(max_bytes + 1)
    if len(body) > max_bytes:
        raise ValueError(f"more than {max_bytes} bytes")
    return str(body.decode("utf-8", errors="replace"))


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def checked_urls(urls: Iterable[str], where: str) -> tuple[str, ...]:
    """``urls`` once each, in order, each a metrics URL; ConfigError naming ``where``.

    >>> checked_urls(["http://a:1/metrics", "http://a:1/metrics"], "urls")
    ('http://a:1/metrics',)
    """
    out: list[str] = []
    for url in urls:
        try:
            MetricsUrl.parse(url)
        except SchemaError as exc:
            raise ConfigError(where, exc.detail, url) from None
        if url not in out:
            out.append(url)
    return tuple(out)


class Scraper:
    """Reads engines' ``/metrics`` (see the module docstring); ``warn(key, message)`` says
    something once per key (the watch's), ``fetch`` is for tests."""

    def __init__(
        self,
        timeout_s: float,
        max_bytes: int,
        workers: int,
        *,
        fetch: Fetch = fetch_text,
        warn: Callable[[str, str], None] | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self._fetch = fetch
        self._warn = warn if warn is not None else (lambda key, message: log.warning(message))
        self._pool = ThreadPoolExecutor(workers, "rlpulse-engines")
        self._lock = threading.Lock()
        self._inflight: dict[str, Future[Reading | None]] = {}
        """Each engine's last scrape (one at a time per engine)."""
        self._down: set[str] = set()
        self._stats = dict.fromkeys(STAT_KEYS, 0)

    def down(self, urls: Iterable[str]) -> list[str]:
        """Those of ``urls`` that are down."""
        with self._lock:
            return [u for u in urls if u in self._down]

    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self._stats)

    def scrape(self, urls: Iterable[str]) -> dict[str, Reading]:
        """Read every engine of ``urls`` at once, now, waiting ``timeout_s`` at most in all:
        the readings of those that answered in time (the others are marked down, counted and
        warned about). An engine whose previous scrape is still out is read once that one is
        back (a reading from before the call would not do), within the same bound."""
        deadline = time.monotonic() + self.timeout_s
        futures: dict[Future[Reading | None], str] = {}
        for url in urls:
            with self._lock:
                previous = self._inflight.get(url)
            if previous is not None and not previous.done():
                wait([previous], timeout=max(0.0, deadline - time.monotonic()))
                if not previous.done():
                    self._timed_out(url)
                    continue
            try:
                future = self._pool.submit(self._read, url, deadline)
            except RuntimeError:  # closed
                break
            with self._lock:
                self._inflight[url] = future
            futures[future] = url
        done, _ = wait(futures, timeout=max(0.0, deadline - time.monotonic()))
        out: dict[str, Reading] = {}
        for future, url in futures.items():
            if future not in done:
                self._timed_out(url)
                continue
            reading = future.result()  # _read never raises
            if reading is not None:
                out[url] = reading
        return out

    def close(self) -> None:
        """Stop the pool (scrapes in flight end on their own timeout)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _timed_out(self, url: str) -> None:
        with self._lock:
            self._stats["scrape_timeouts"] += 1
            self._down.add(url)
        self._warn(
            f"timeout:{url}",
            f"{url} did not answer within {self.timeout_s} s: left out of the step "
            "(rollout/engine/servers_unread), retried in the background",
        )

    def _read(self, url: str, deadline: float) -> Reading | None:
        """One scrape of one engine (on the pool); None, counted and warned, when it fails.
        An engine that answers after ``deadline`` (its caller stopped waiting) stays down."""
        with self._lock:
            self._stats["scrapes"] += 1
        try:
            text = self._fetch(url, self.timeout_s, self.max_bytes)
        except Exception as exc:
            self._failed(url, "scrape_failures", f"cannot read {url}: {exc!r:.200}")
            return None
        try:
            reading = parse(text)
        except ParseError as exc:
            self._failed(url, "unreadable", f"{url} is not Prometheus text: {exc}")
            return None
        if reading.empty:
            self._failed(
                url,
                "no_vllm_metrics",
                f"{url} has no vLLM metrics (a server started with --disable-log-stats? "
                "verl: set actor_rollout_ref.rollout.disable_log_stats=False)",
            )
            return None
        if time.monotonic() <= deadline:
            with self._lock:
                self._down.discard(url)
        return reading

    def _failed(self, url: str, key: str, message: str) -> None:
        with self._lock:
            self._stats[key] += 1
            self._down.add(url)
        self._warn(f"{key}:{url}", message + " (left out of the step; counted in stats())")
