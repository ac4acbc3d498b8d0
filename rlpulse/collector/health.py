"""The collector's self-metrics: what it received, rejected, emitted and dropped.

Each counter is declared once, here, with its Prometheus name and help
(:class:`SelfMetric`): the Prometheus sink renders every declared one, so a counter cannot be
counted and never exported. Counters are plain integer attributes of :class:`Health`, written
by the daemon's main thread; any thread reads them through :meth:`Health.snapshot` (the
Prometheus sink renders it on every scrape).

>>> h = Health()
>>> h.reject("bad_version")
>>> h.snapshot()["malformed"]
{'bad_version': 1}
>>> Health.late.name
'rlpulse_collector_late_entries_total'
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal, overload

from rlpulse.schemas.protocol import COLLECTOR_DROP_KEYS, DROP_KEYS

_SENDER_DROPS = tuple(k for k in DROP_KEYS if k not in COLLECTOR_DROP_KEYS)

Kind = Literal["counter", "gauge"]


class SelfMetric:
    """One exported self-metric. As a class attribute of :class:`Health` it declares the
    counter of the same name; instances hold the number itself."""

    def __init__(self, name: str, help: str, kind: Kind = "counter", key: str = "") -> None:
        self.name = name
        self.help = help
        self.kind: Kind = kind
        self.key = key
        """Where the value is found: the attribute of :class:`Health`, or the snapshot key."""

    def __set_name__(self, owner: type, key: str) -> None:
        self.key = key

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> SelfMetric: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> float: ...  # paused_seconds

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        return self if obj is None else obj.__dict__.get(self.key, 0)


MALFORMED = SelfMetric(
    "rlpulse_collector_malformed_total",
    "Messages rejected as malformed, by reason.",
    key="malformed",
)
"""Labelled by ``reason``; every reason in ``rlpulse.schemas.errors.REJECT_REASONS`` from start-up."""

SINK_METRICS: tuple[SelfMetric, ...] = (
    SelfMetric(
        "rlpulse_sink_queue_depth", "Steps waiting in a sink's queue.", "gauge", "queue_depth"
    ),
    SelfMetric("rlpulse_sink_written_total", "Steps a sink has written.", key="written"),
    SelfMetric("rlpulse_sink_errors_total", "Failed write attempts of a sink.", key="errors"),
    SelfMetric(
        "rlpulse_sink_dropped_total",
        "Steps a sink dropped (queue full or retries spent).",
        key="dropped",
    ),
    SelfMetric(
        "rlpulse_sink_lost_total",
        "Steps a sink never got: the state_dir outbox records holding them were damaged.",
        key="lost",
    ),
    SelfMetric(
        "rlpulse_sink_samples_failed_total",
        "Steps whose samples a sink could not write (their numbers were written).",
        key="samples_failed",
    ),
    SelfMetric(
        "rlpulse_sink_lag_seconds",
        "Age of the oldest step still waiting in a sink's queue.",
        "gauge",
        "lag_seconds",
    ),
)
"""Per sink (label ``sink``), read from each ``SinkWorker.stats()`` by key."""


class Health:
    """Counters of the receive and aggregate path. ``sinks`` gives every sink's counters
    (``FanOut.stats``) for :meth:`snapshot`; without it there are none.

    >>> Health(sinks=lambda: {"jsonl": {"written": 3}}).snapshot()["sinks"]
    {'jsonl': {'written': 3}}
    """

    messages_received = SelfMetric(
        "rlpulse_collector_messages_received_total", "Messages the collector received."
    )
    events_received = SelfMetric(
        "rlpulse_collector_events_received_total", "Metric entries the collector received."
    )
    late = SelfMetric(
        "rlpulse_collector_late_entries_total",
        "Entries that arrived after their step had been emitted (not in any sink).",
    )
    partial_steps = SelfMetric(
        "rlpulse_collector_partial_steps_total",
        "Steps emitted before every expected rank had finished them.",
    )
    steps_emitted = SelfMetric("rlpulse_collector_steps_emitted_total", "Steps handed to sinks.")
    unknown_producer = SelfMetric(
        "rlpulse_collector_unknown_producer_total",
        "Messages dropped because their producer never registered.",
    )
    duplicates = SelfMetric(
        "rlpulse_collector_duplicates_total",
        "Resent messages the collector had already applied (deduplicated, not merged twice).",
    )
    out_of_order = SelfMetric(
        "rlpulse_collector_out_of_order_total",
        "Messages that arrived ahead of a missing one (dropped; the producer resends in order).",
    )
    handshake_failed = SelfMetric(
        "rlpulse_collector_handshake_failed_total",
        "Clients refused by CurveZMQ (unknown key or plaintext).",
    )
    kind_mismatch = SelfMetric(
        "rlpulse_collector_kind_mismatch_total",
        "Entries whose declared reduction disagreed with the catalog (the catalog won).",
    )
    derived_logged = SelfMetric(
        "rlpulse_collector_derived_logged_total",
        "Metrics producers logged although the collector computes them (dropped).",
    )
    names_overflow = SelfMetric(
        "rlpulse_collector_names_overflow_total",
        "Metric names dropped because a run reached its distinct-name limit.",
    )
    world_size_conflict = SelfMetric(
        "rlpulse_collector_world_size_conflict_total",
        "Registrations whose world size disagreed with the role's first registration.",
    )
    held_back = SelfMetric(
        "rlpulse_collector_held_back_total",
        "Times a producer was held back: its message would have opened a step while its run "
        "already held max_open_steps open steps (a producer ahead of the others). What it sent "
        "meanwhile is kept and applied once steps are emitted.",
    )
    run_attempts = SelfMetric(
        "rlpulse_collector_run_attempts_total",
        "Registrations under the name of a run that had ended here, recorded as a new attempt "
        "(name-2, name-3...) instead of continuing it (producers that resume continue it).",
    )
    runs_forgotten = SelfMetric(
        "rlpulse_collector_runs_forgotten_total",
        "Runs forgotten run_retention_s after they ended (no open step, every rank finished or "
        "presumed gone): their state left memory, the checkpoint and /metrics; a tombstone "
        "keeps what their producers send later counted as late.",
    )
    rank_takeovers = SelfMetric(
        "rlpulse_collector_rank_takeovers_total",
        "Registrations of a (run, role, rank) slot another process held (a restarted rank, or "
        "two processes claiming one rank): the newest holds it, the other's open data is "
        "withdrawn.",
    )
    conflict_entries = SelfMetric(
        "rlpulse_collector_conflict_entries_total",
        "Entries refused because their producer no longer holds its (role, rank) slot.",
    )
    incomplete_steps = SelfMetric(
        "rlpulse_collector_incomplete_steps_total",
        "Steps a rank said it sent without some of its values, which its producer dropped "
        "before it could reduce them (past its pending_limit_bytes, or left when close() "
        "ended), one per rank and step: each went out partial naming the rank.",
    )
    continued_steps = SelfMetric(
        "rlpulse_collector_continued_steps_total",
        "Steps written after a restart without state_dir that an earlier instance of this "
        "collector may have written too, with other calls of the step (its producers said so "
        "when they reconnected): flagged partial and continued.",
    )
    resent_entries = SelfMetric(
        "rlpulse_collector_resent_entries_total",
        "Entries merged after a restart without state_dir that had been sent to an earlier "
        "instance of this collector, unacknowledged: it may have written them too (counted "
        "twice over two records of a step, named in the record's resent).",
    )
    overcounted_steps = SelfMetric(
        "rlpulse_collector_overcounted_steps_total",
        "Steps emitted partial because a role had more contributors than its world size, or "
        "held data of a replaced process that could not be withdrawn (behind a relay).",
    )
    clock_skew = SelfMetric(
        "rlpulse_collector_clock_skew_entries_total",
        "Entries whose log() time was ahead of the collector's clock when it received them "
        "(by more than CLOCK_SKEW_S: a rank's clock is ahead). Their time was bounded by the "
        "receive time, so records and system/tps keep the collector's time; each skewed rank "
        "is named once in the log.",
    )
    unapplied = SelfMetric(
        "rlpulse_collector_unapplied_entries_total",
        "Entries from producers whose registration never arrived, lost at shutdown.",
    )
    disk_errors = SelfMetric(
        "rlpulse_collector_disk_errors_total",
        "Failed writes under state_dir (write-ahead log, outbox, checkpoint, sink cursors), "
        "retries included.",
    )
    state_writable = SelfMetric(
        "rlpulse_collector_state_writable",
        "1 while the write-ahead log and outbox can be written; 0 while they cannot (a full "
        "disk): nothing is acknowledged then, so producers keep their data, until it can.",
        "gauge",
    )
    paused_seconds = SelfMetric(
        "rlpulse_collector_paused_seconds_total",
        "Seconds the collector could not hear producers through its own fault (frozen, "
        "overloaded, or state_dir not writable): not counted against their liveness or grace.",
    )
    producers = SelfMetric(
        "rlpulse_collector_producers",
        "Producers registered since start-up (recovered ones included).",
        "gauge",
    )
    scrape_targets = SelfMetric(
        "rlpulse_collector_scrape_targets",
        "Registered /metrics endpoints listed for Prometheus service discovery (/sd).",
        "gauge",
    )
    scrape_targets_refused = SelfMetric(
        "rlpulse_collector_scrape_targets_refused_total",
        "Registered /metrics endpoints left out of service discovery (/sd) because the "
        "collector's sd_targets refuses their host (a link-local or cloud metadata address by "
        "default, or a host not in sd_targets.allow); once per registration.",
    )

    relays_silent = SelfMetric(
        "rlpulse_collector_relays_silent",
        "Relays below this collector silent for liveness_s or longer, with ranks running "
        "behind them: not taken for dead ranks, their steps wait as for slow ranks (grace_s) "
        "until they speak again or are presumed dead.",
        "gauge",
    )
    relays_presumed_dead = SelfMetric(
        "rlpulse_collector_relays_presumed_dead",
        "Relays below this collector silent for max(grace_s, liveness_s) or longer, with "
        "ranks behind them: presumed dead, their ranks gone, the steps waiting for them "
        "emitted partial naming them, until they speak again.",
        "gauge",
    )

    def __init__(self, *, sinks: Callable[[], Mapping[str, Mapping[str, float]]] = dict) -> None:
        for metric in self.declared():
            setattr(self, metric.key, 0)
        self.malformed: Counter[str] = Counter()
        self.relays: Mapping[tuple[str, str], Mapping[str, float]] = {}
        """Per relay below with ranks running behind it, by (relay id, host): its
        ``RELAY_METRICS`` (``rlpulse.collector.tiers.watch``; replaced whole, never changed)."""
        self.producer_stats: dict[int, Mapping[str, int]] = {}
        self._forgotten: Counter[str] = Counter()
        """The last counters of producers forgotten since (their runs ended long ago), so
        the totals exported never go down."""
        self._sinks = sinks

    @classmethod
    def declared(cls) -> Iterator[SelfMetric]:
        """Every counter and gauge of this class, with its exported name."""
        for value in vars(cls).values():
            if isinstance(value, SelfMetric):
                yield value

    def reject(self, reason: str) -> None:
        self.malformed[reason] += 1

    def producer_dropped(self) -> int:
        """Log calls producers reported dropping (queue or buffer full, unacknowledged at close);
        what the collector itself left out (late, conflicts) is counted by its own counters."""
        return self._producers_total(_SENDER_DROPS)

    def forget_producer(self, pid: int) -> None:
        """Producer ``pid`` is forgotten: its counters stay in the totals."""
        stats = self.producer_stats.pop(pid, None)
        if stats:
            self._forgotten.update(stats)

    def _producers_total(self, keys: tuple[str, ...]) -> int:
        """The producers' own counters ``keys``, as their last heartbeat or goodbye said
        (forgotten producers' included)."""
        live = sum(s.get(k, 0) for s in list(self.producer_stats.values()) for k in keys)
        return live + sum(self._forgotten[k] for k in keys)

    def snapshot(self) -> dict[str, Any]:
        out: dict[str, Any] = {m.key: getattr(self, m.key) for m in self.declared()}
        for metric, keys in PRODUCER_COUNTERS:
            out[metric.key] = self._producers_total(keys)
        out["malformed"] = dict(self.malformed)
        out["sinks"] = {k: dict(v) for k, v in self._sinks().items()}
        out["relays"] = {k: dict(v) for k, v in self.relays.items()}
        return out


PRODUCER_DROPPED = SelfMetric(
    "rlpulse_collector_producer_dropped_total",
    "Entries producers reported dropping before sending (queue full, collector away), and "
    "values they dropped before reducing them (dropped_unreduced: their steps go out partial).",
    key="producer_dropped",
)
"""Summed from the producers' own counters (heartbeats and goodbyes)."""
PRODUCER_ERRORS = SelfMetric(
    "rlpulse_collector_producer_errors_total",
    "log() calls producers reported failing inside rlpulse and skipping: their values are "
    "missing from their steps.",
    key="producer_errors",
)
PRODUCER_INVALID = SelfMetric(
    "rlpulse_collector_producer_invalid_total",
    "Values producers left out of log() calls as invalid (a bad name, type or mask).",
    key="producer_invalid",
)
PRODUCER_SAMPLES_DROPPED = SelfMetric(
    "rlpulse_collector_producer_samples_dropped_total",
    "Rows of Samples values producers left out as bad (a key that is not a finite number, a "
    "value that is not a string, number, boolean or None, too many fields).",
    key="producer_samples_dropped",
)
RELAY_DISK_ERRORS = SelfMetric(
    "rlpulse_collector_relay_disk_errors_total",
    "Failed writes under the state_dir of the relays below this collector, retries included, "
    "as their heartbeats last said.",
    key="relay_disk_errors",
)
RELAYS_UNWRITABLE = SelfMetric(
    "rlpulse_collector_relays_state_unwritable",
    "Relays below this collector whose state_dir cannot be written now (a full disk): they "
    "receive nothing meanwhile (their ranks keep their data) but keep heartbeating, so their "
    "ranks are not presumed dead for it.",
    "gauge",
    key="relays_state_unwritable",
)
RELAY_METRICS: tuple[SelfMetric, ...] = (
    SelfMetric(
        "rlpulse_collector_relay_silent_seconds",
        "Seconds since this collector last heard from a relay below it that has ranks "
        "running behind it (it speaks every few seconds): from liveness_s on it is silent, "
        "from max(grace_s, liveness_s) presumed dead.",
        "gauge",
        "silent_seconds",
    ),
    SelfMetric(
        "rlpulse_collector_relay_waiting_steps",
        "Open steps waiting for ranks behind a relay below this collector (held for them "
        "while it is silent, until it speaks again or is presumed dead).",
        "gauge",
        "waiting_steps",
    ),
)
"""Per relay below (labels ``relay``, its id as in the log, and ``host``), read from the
snapshot's ``relays`` by key."""
PRODUCER_COUNTERS = (
    (PRODUCER_DROPPED, _SENDER_DROPS),
    (PRODUCER_ERRORS, ("errors",)),
    (PRODUCER_INVALID, ("invalid",)),
    (PRODUCER_SAMPLES_DROPPED, ("samples_dropped",)),
    (RELAY_DISK_ERRORS, ("disk_errors",)),
    (RELAYS_UNWRITABLE, ("state_unwritable",)),
)
"""What the collector exports of the producers' own counters (``STAT_KEYS``): each
self-metric, and the counters summed into it over every producer."""
PRODUCER_METRICS = tuple(metric for metric, _ in PRODUCER_COUNTERS)


HTTP_TIMEOUTS = SelfMetric(
    "rlpulse_collector_http_timeouts_total",
    "Connections to /metrics or /sd closed without an answer: no whole request head arrived "
    "within the server's timeout (idle, half-open or slow clients).",
    key="http_timeouts",
)
HTTP_OVERSIZED = SelfMetric(
    "rlpulse_collector_http_oversized_total",
    "Requests to /metrics or /sd refused (431) because their head was larger than the server "
    "reads.",
    key="http_oversized",
)
HTTP_METRICS = (HTTP_TIMEOUTS, HTTP_OVERSIZED)
"""The /metrics server's own counters (``rlpulse.collector.sinks.promhttp``): the Prometheus
sink adds them to the health snapshot it renders."""


def exported() -> Iterator[SelfMetric]:
    """Every self-metric the Prometheus sink renders, labels aside."""
    yield from Health.declared()
    yield from PRODUCER_METRICS
    yield from HTTP_METRICS
    yield MALFORMED
    yield from SINK_METRICS
    yield from RELAY_METRICS
