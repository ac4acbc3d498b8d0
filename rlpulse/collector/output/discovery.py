"""Prometheus HTTP service discovery of the ``/metrics`` endpoints producers registered.

A process that serves Prometheus metrics of its own (a vLLM engine, a reward server) registers
its URL through its producer (``Producer(..., metrics_url=...)``, or ``rlpulse
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

Any process that reaches the collector's port can register a URL, and Prometheus then fetches
it: without CurveZMQ, any local process could point Prometheus at a cloud metadata service or
an internal host. The collector's ``sd_targets`` (:class:`TargetPolicy`) decides which hosts
may be listed: ``deny`` (by default the link-local networks and the cloud metadata addresses)
always wins, and ``allow``, when given, lists the only hosts and networks accepted. Hosts are
matched as written in the URL, never resolved: an IP address (in any form a resolver reads,
``2852039166`` or ``[::ffff:169.254.169.254]`` too) against networks, a name against names
and ``*.suffix`` patterns. A refused endpoint is not listed, is logged once and is counted
(``rlpulse_collector_scrape_targets_refused_total``)::

    sd_targets:
      allow: [10.0.0.0/8, "*.svc.cluster.local"]

>>> d = Discovery()
>>> d.publish([ScrapeTarget("http://10.0.0.7:8000/metrics", "r1", "rollout", 0, "node-7")])
>>> sd_groups(d.targets())[0]["targets"]
['10.0.0.7:8000']
>>> TargetPolicy().refusal("http://169.254.169.254/latest/meta-data")
'169.254.169.254 is in sd_targets.deny (169.254.0.0/16)'
"""

from __future__ import annotations

import ipaddress
import json
import logging
import re
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from rlpulse.schemas.endpoint import MetricsUrl
from rlpulse.schemas.errors import ConfigError

if TYPE_CHECKING:
    from rlpulse.collector.health import Health

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


IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
_NAME = re.compile(r"(?:\*\.)?[a-z0-9_](?:[a-z0-9_.-]*[a-z0-9_])?")
"""A host name, or ``*.`` and a suffix (lower case)."""
_NUMERIC = re.compile(r"[0-9a-fx.]+")
"""What a resolver might read as an IPv4 address (``inet_aton``: decimal, octal, hex parts)."""


@dataclass(frozen=True)
class HostRule:
    """One entry of ``sd_targets.allow`` or ``deny``: a network (an address is a network of
    one), a host name, or ``*.suffix`` (any name under the suffix)."""

    text: str
    network: IpNetwork | None = None

    @classmethod
    def parse(cls, entry: object, where: str) -> HostRule:
        """The rule ``entry`` spells; ConfigError naming ``where`` when it is none."""
        if not isinstance(entry, str) or not entry.strip():
            raise ConfigError(
                where, "must be a network (10.0.0.0/8), an address or a host name", entry
            )
        text = entry.strip().lower().rstrip(".")
        if "/" in text or ":" in text or _as_ip(text, numeric=False) is not None:
            try:
                return cls(text, ipaddress.ip_network(text.strip("[]"), strict=True))
            except ValueError as exc:
                raise ConfigError(where, f"is not a network or address: {exc}", entry) from None
        if not _NAME.fullmatch(text):
            raise ConfigError(
                where, "must be a network, an address, a host name or *.suffix", entry
            )
        return cls(text)

    def matches(self, host: str, address: IpAddress | None) -> bool:
        """Does the URL host ``host`` (``address`` when it is an IP address) fall under it?"""
        if self.network is not None:
            return address is not None and any(a in self.network for a in _forms(address))
        if address is not None:
            return False
        if self.text.startswith("*."):
            return host.endswith(self.text[1:])
        return host == self.text


DEFAULT_DENY = (
    "169.254.0.0/16",  # IPv4 link-local: AWS, Azure, GCP, Oracle... metadata at 169.254.169.254
    "fe80::/10",  # IPv6 link-local
    "fd00:ec2::254",  # AWS metadata over IPv6
    "100.100.100.200",  # Alibaba Cloud metadata
    "metadata.google.internal",
    "metadata.goog",
)
"""What ``sd_targets.deny`` holds unless the config says otherwise (``deny: []`` lifts it)."""


@dataclass(frozen=True)
class TargetPolicy:
    """Which registered endpoints ``/sd`` may list: a host in ``deny`` never is; with
    ``allow`` (None: anything not denied), only hosts it names are. From the collector's
    ``sd_targets`` (:meth:`from_mapping`).

    >>> policy = TargetPolicy.from_mapping({"allow": ["10.0.0.0/8", "*.cluster.local"]})
    >>> policy.refusal("http://10.1.2.3:8000/metrics") is None
    True
    >>> policy.refusal("http://db.internal:5432/metrics")
    'db.internal is not in sd_targets.allow'
    """

    allow: tuple[HostRule, ...] | None = None
    deny: tuple[HostRule, ...] = field(
        default_factory=lambda: _rules(DEFAULT_DENY, "sd_targets.deny")
    )

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any] | None) -> TargetPolicy:
        """The policy of the config's ``sd_targets`` (None: the default); ConfigError names
        the bad field."""
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise ConfigError("sd_targets", "must be a mapping with allow and/or deny", raw)
        unknown = sorted(set(raw) - {"allow", "deny"})
        if unknown:
            raise ConfigError(f"sd_targets.{unknown[0]}", "unknown key; the keys are allow, deny")
        allow = raw.get("allow")
        deny = raw.get("deny", DEFAULT_DENY) or ()  # an empty deny lifts the default
        return cls(
            None if allow is None else _rules(allow, "sd_targets.allow"),
            _rules(deny, "sd_targets.deny"),
        )

    def refusal(self, url: str) -> str | None:
        """Why ``url`` may not be listed, or None when it may."""
        host = (urlsplit(url).hostname or "").rstrip(".")
        address = _as_ip(host)
        for rule in self.deny:
            if rule.matches(host, address):
                return f"{host} is in sd_targets.deny ({rule.text})"
        if self.allow is not None and not any(r.matches(host, address) for r in self.allow):
            return f"{host} is not in sd_targets.allow"
        return None


def _rules(entries: object, where: str) -> tuple[HostRule, ...]:
    if not isinstance(entries, list | tuple):
        raise ConfigError(where, "must be a list of networks, addresses or host names", entries)
    return tuple(HostRule.parse(e, f"{where}[{i}]") for i, e in enumerate(entries))


def _as_ip(host: str, numeric: bool = True) -> IpAddress | None:
    """``host`` as an IP address, or None for a name. With ``numeric``, also the forms only
    a resolver's ``inet_aton`` reads (``2852039166``, ``0xa9fea9fe``, ``169.254.43518``), as
    the scraper's resolver might."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    if numeric and _NUMERIC.fullmatch(host):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def _forms(address: IpAddress) -> tuple[IpAddress, ...]:
    """``address`` and the IPv4 address an IPv6 one carries (``::ffff:a.b.c.d``)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return (address, address.ipv4_mapped)
    return (address,)


class Discovery:
    """The targets as last published by the collector's main thread, for the HTTP server's
    threads to read (see the module docstring). Endpoints ``policy`` refuses are left out;
    each is logged and counted (``health.scrape_targets_refused``) once per registration."""

    def __init__(self, policy: TargetPolicy | None = None, health: Health | None = None) -> None:
        self._policy = policy if policy is not None else TargetPolicy()
        self._health = health
        self._targets: tuple[ScrapeTarget, ...] = ()
        self._refused: frozenset[ScrapeTarget] = frozenset()
        self.refused = 0
        """Registrations refused since start-up."""

    def publish(self, targets: Iterable[ScrapeTarget]) -> None:
        """Replace the list (main thread); duplicates are listed once, in a stable order."""
        listed: list[ScrapeTarget] = []
        refused: set[ScrapeTarget] = set()
        for target in set(targets):
            if target in self._refused:
                refused.add(target)
                continue
            reason = self._policy.refusal(target.url)
            if reason is None:
                listed.append(target)
                continue
            refused.add(target)
            self.refused += 1
            log.warning(
                "service discovery: not listing %s (run %s, role %s, rank %d, host %s): %s",
                target.url,
                target.run,
                target.role,
                target.rank,
                target.host,
                reason,
            )
        self._refused = frozenset(refused)
        self._targets = tuple(sorted(listed))
        if self._health is not None:
            self._health.scrape_targets_refused = self.refused

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
