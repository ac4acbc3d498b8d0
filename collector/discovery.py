"""Prometheus HTTP service discovery of the ``/metrics`` endpoints producers registered.

A process that serves Prometheus metrics of its own (a vLLM engine, a reward server) registers
its URL through its producer (``Producer(..., metrics_url=...)``, or ``python -m collector
register``). The collector lists every registered endpoint whose producer is alive at
``GET /sd`` on its Prometheus sink's server, in the format of Prometheus' ``http_sd_configs``,
with the producer's ``run``, ``role``, ``rank`` and ``host`` as target labels; a Prometheus job
pointed at it scrapes every engine of every run without a hand-written target list::

    scrape_configs:
      - job_name: rlpulse-endpoints
        http_sd_configs: [{url: "http://collector:9464/sd"}]

The membership that decides who is listed lives on the collector's main thread; the HTTP
server answers on its own threads. The main thread publishes a fresh immutable tuple of
targets (:meth:`Discovery.publish`: one reference swap, atomic), which the server only reads.

>>> d = Discovery()
>>> d.publish([ScrapeTarget("http://10.0.0.7:8000/metrics", "r1", "rollout", 0, "node-7")])
>>> sd_groups(d.targets())[0]["targets"]
['10.0.0.7:8000']
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from schemas.endpoint import MetricsUrl

log = logging.getLogger("rlpulse.collector")

SD_PATH = "/sd"
"""Where the Prometheus sink's server answers service discovery."""
PUBLISH_S = 0.5
"""How often the daemon re-publishes the targets: a producer's hello, goodbye or silence
shows at ``/sd`` within this (Prometheus itself refreshes every ``refresh_interval``)."""

Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


@dataclass(frozen=True, order=True)
class ScrapeTarget:
    """One registered endpoint and the labels Prometheus gives every series it scrapes there
    (``url`` is checked already: it came through the decoder or the producer)."""

    url: str
    run: str
    role: str
    rank: int
    host: str

    def group(self) -> dict[str, Any]:
        """This target as one http_sd target group."""
        url = MetricsUrl.parse(self.url)
        return {
            "targets": [url.address],
            "labels": {
                "__scheme__": url.scheme,
                "__metrics_path__": url.path,
                "run": self.run,
                "role": self.role,
                "rank": str(self.rank),
                "host": self.host,
            },
        }


def sd_groups(targets: Sequence[ScrapeTarget]) -> list[dict[str, Any]]:
    """The http_sd document: a list of target groups (``[]`` when nothing is registered)."""
    return [t.group() for t in targets]


class Discovery:
    """The targets as last published by the collector's main thread, for the HTTP server's
    threads to read (see the module docstring)."""

    def __init__(self) -> None:
        self._targets: tuple[ScrapeTarget, ...] = ()

    def publish(self, targets: Iterable[ScrapeTarget]) -> None:
        """Replace the list (main thread); duplicates are listed once, in a stable order."""
        self._targets = tuple(sorted(set(targets)))

    def targets(self) -> tuple[ScrapeTarget, ...]:
        """The current list (any thread)."""
        return self._targets


def with_discovery(app: Wsgi, targets: Callable[[], Sequence[ScrapeTarget]]) -> Wsgi:
    """``app`` (the ``/metrics`` WSGI app), answering ``GET /sd`` with ``targets()`` as
    http_sd JSON. A failure to list them answers 500: Prometheus keeps its last list."""

    def routed(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != SD_PATH:
            return app(environ, start_response)
        if environ.get("REQUEST_METHOD") != "GET":
            start_response("405 Method Not Allowed", [("Allow", "GET")])
            return [b""]
        try:
            body = json.dumps(sd_groups(targets())).encode()
        except Exception:  # never take the /metrics server down with it
            log.exception("service discovery: listing the registered endpoints failed")
            start_response("500 Internal Server Error", [("Content-Type", "text/plain")])
            return [b"listing the registered endpoints failed\n"]
        start_response(
            "200 OK",
            [("Content-Type", "application/json"), ("Content-Length", str(len(body)))],
        )
        return [body]

    return routed
