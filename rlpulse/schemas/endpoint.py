"""A Prometheus ``/metrics`` URL that a producer registers with the collector (an inference
engine's, a reward server's), checked once here for the producer, the decoder and the
collector's service discovery alike.

The collector lists every registered URL for Prometheus' HTTP service discovery
(``rlpulse.collector.output.discovery``), which wants the target's address, scheme and path apart, and no
more: no credentials (the URL is served to anyone who can read ``/sd``), no query or fragment.

>>> MetricsUrl.parse("http://10.0.0.5:8000/metrics")
MetricsUrl(scheme='http', address='10.0.0.5:8000', path='/metrics')
>>> MetricsUrl.parse("https://[::1]:9100").path  # no path: Prometheus' default
'/metrics'
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from rlpulse.schemas.errors import SchemaError

MAX_URL_LENGTH = 1024
"""Longest metrics URL a hello may carry."""
DEFAULT_PATH = "/metrics"
"""The path of a URL that names none, as Prometheus' own ``metrics_path`` default."""
SCHEMES = ("http", "https")
_ADDRESS = re.compile(r"(?:[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\])(?::(?P<port>[0-9]{1,5}))?")
"""``host[:port]``: a name or IPv4 address, or an IPv6 address in brackets."""


@dataclass(frozen=True)
class MetricsUrl:
    """A checked metrics URL, in the parts Prometheus scrapes it by: ``address``
    (``host[:port]``, an IPv6 host in brackets), ``scheme`` and ``path``."""

    scheme: str
    address: str
    path: str

    @classmethod
    def parse(cls, url: object) -> MetricsUrl:
        """The parts of ``url``; raise :class:`SchemaError` (``bad_field``) saying what is
        wrong with it."""
        if not isinstance(url, str) or not 0 < len(url) <= MAX_URL_LENGTH:
            raise _bad(f"must be a string of 1..{MAX_URL_LENGTH} characters", url)
        if not url.isascii() or not url.isprintable() or " " in url:
            raise _bad("must be ASCII with no spaces or control characters", url)
        parts = urlsplit(url)
        if parts.scheme not in SCHEMES:
            raise _bad("must start with http:// or https://", url)
        if "@" in parts.netloc:
            raise _bad("must not hold credentials (it is served to Prometheus as is)", url)
        address = _ADDRESS.fullmatch(parts.netloc)
        if address is None:
            raise _bad("must name a host, and may add :PORT", url)
        if address["port"] is not None and not 0 < int(address["port"]) <= 65535:
            raise _bad("has a port that is not a number from 1 to 65535", url)
        if parts.query or parts.fragment:
            raise _bad("must have no query or fragment", url)
        return cls(parts.scheme, parts.netloc, parts.path or DEFAULT_PATH)


def _bad(problem: str, url: object) -> SchemaError:
    return SchemaError("bad_field", f"metrics URL {problem}, got {url!r:.120}", url)
