"""The producer's settings: one frozen dataclass, every default written here once.

>>> ProducerConfig(heartbeat_s=0.5).close_timeout_s
2.0
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from rlpulse.schemas.errors import ConfigError
from rlpulse.schemas.samples import SampleLimits

MIB = 1024 * 1024
FLUSH_TIMEOUT_S = 5.0
"""How long ``flush()`` waits by default."""


def goodbye_share_s(timeout_s: float) -> float:
    """The last share of a ``close()`` of ``timeout_s`` seconds, kept for the goodbye and its
    acknowledgement: GPU values and ``Samples`` rows not ready before it are dropped, counted,
    and their steps told to the collector as incomplete."""
    return min(0.5, timeout_s / 4)


@dataclass(frozen=True)
class ProducerConfig:
    """How a producer buffers, paces and bounds its work.

    * ``max_pending``: ``log()`` calls queued for the sender thread; beyond it calls are
      dropped and counted (``dropped_queue_full``).
    * ``heartbeat_s``: seconds between heartbeats (the collector's liveness and the producer's
      counters ride on them).
    * ``close_timeout_s``: how long ``close()`` waits for the collector's acknowledgements.
    * ``sndhwm``: messages ZeroMQ may queue on a live connection before sends are refused.
    * ``max_unacked``, ``max_unacked_bytes``: messages kept for resending until acknowledged;
      beyond either, new ones are dropped and counted (``dropped_buffer_full``); the bye at
      ``close()`` alone goes past them, so the collector learns the last step is done.
    * ``resend_s``: acknowledgements stalled this long make the producer resend.
    * ``gpu_sample_s``: seconds between NVML readings of the GPUs; 0 turns GPU state off.
    * ``snapshot_limit_bytes``: memory held by snapshots the sender has not reduced yet, GPU
      memory and host copies each; past it ``log()`` reduces at once (on the caller's stream
      for GPU values, ``rlpulse.producer.device``; in the caller for host arrays,
      ``rlpulse.producer.reduce``).
    * ``pending_limit_bytes``: memory held by ``Samples`` values ``log()`` handed to the
      sender thread that it has not reduced yet (estimated in ``log()``,
      ``rlpulse.producer.pending``); a value past it is dropped and counted
      (``dropped_unreduced``), the rest of its call still goes, and its step reaches the
      collector as incomplete: emitted partial, naming this rank. It also bounds how long a
      step's numbers wait behind rows queued before them.
    * ``samples_k``: rows a ``Samples`` value keeps in each of top, bottom and random, unless
      the value says (``Samples(rows, key, k=...)``); 1..1024.
    * ``samples_field_bytes``: a text field of a sample row is cut to this many UTF-8 bytes
      (and says so; at least 16); ``samples_row_fields``: a row with more fields is dropped.
    """

    max_pending: int = 10_000
    heartbeat_s: float = 1.0
    close_timeout_s: float = 2.0
    sndhwm: int = 1000
    max_unacked: int = 10_000
    max_unacked_bytes: int = 256 * MIB
    resend_s: float = 2.0
    gpu_sample_s: float = 1.0
    snapshot_limit_bytes: int = 256 * MIB
    pending_limit_bytes: int = 256 * MIB
    samples_k: int = 8
    samples_field_bytes: int = 4096
    samples_row_fields: int = 64

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", int):
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ConfigError(f.name, "must be a positive integer", value)
            elif isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f.name, "must be a number of seconds", value)
            elif not math.isfinite(value) or value < 0:
                raise ConfigError(f.name, "must be a finite, non-negative number of seconds", value)
        if self.heartbeat_s <= 0 or self.resend_s <= 0:
            name = "heartbeat_s" if self.heartbeat_s <= 0 else "resend_s"
            raise ConfigError(name, "must be positive", getattr(self, name))
        if self.samples_k > 1024:
            raise ConfigError("samples_k", "must be at most 1024", self.samples_k)
        if self.samples_field_bytes < 16:
            raise ConfigError(
                "samples_field_bytes", "must be at least 16", self.samples_field_bytes
            )

    def sample_limits(self) -> SampleLimits:
        """What a ``Samples`` value keeps (``rlpulse.schemas.samples``)."""
        return SampleLimits(self.samples_k, self.samples_field_bytes, self.samples_row_fields)


DEFAULT = ProducerConfig()
