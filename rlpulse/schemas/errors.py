"""The errors rlpulse raises on bad input: on the wire (:class:`SchemaError`) and in
configuration (:class:`ConfigError`), shared by every package."""

from __future__ import annotations

from typing import Any

REJECT_REASONS: tuple[str, ...] = (
    "oversized",  # larger than the collector's max_message_bytes
    "bad_msgpack",  # not a msgpack document, or one with an extension type
    "bad_version",  # a protocol version this collector does not speak
    "bad_envelope",  # not a map, an unknown message type, a bad entry list
    "bad_field",  # an envelope field of the wrong type or out of range
    "bad_entry",  # an entry that is not [step, time, names, kinds, values, nonfinite]
    "bad_step",  # a negative or non-integer step
    "bad_names",  # names not a list of strings within the limits, or a name twice
    "bad_kinds",  # reduction codes that do not match the names
    "bad_values",  # value rows of the wrong size or impossible (negative weight, min > max)
    "bad_table",  # an entry refers to a name table its producer's hello did not declare
    "bad_sketch",  # a distribution's quantile sketch that is not one (rlpulse.schemas.sketch)
    "bad_samples",  # a samples state that is not one (rlpulse.schemas.samples.decode)
    "bad_config",  # a hello's run config that is not one (rlpulse.schemas.runconfig.decode)
    "bad_frames",  # a ZeroMQ message of more than one frame (the collector's receiver)
    "relay_of_relay",  # a relay's hello sent to a relay: one tier of relays, then the root
)
"""Every reason a message is rejected for: the ``reason`` of each :class:`SchemaError` the wire
protocol raises, and ``bad_frames``. The collector counts rejects by these
(``rlpulse_collector_malformed_total{reason}``, every one exported from start-up)."""


class SchemaError(ValueError):
    """A message, value or name that does not follow the catalog or the wire protocol.

    ``reason`` is a short stable token, one of :data:`REJECT_REASONS` (``"bad_version"``,
    ``"bad_values"``...), that the collector counts rejects by; ``detail`` says in words what
    was wrong.

    >>> SchemaError("bad_version", "protocol version 7 is not supported").reason
    'bad_version'
    """

    def __init__(self, reason: str, detail: str, data: Any = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.data = data


class ConfigError(ValueError):
    """A configuration value that cannot work; ``field`` names it (``tracker_kwargs.jsonl.path``).

    >>> str(ConfigError("grace_s", "must be positive", -1))
    'grace_s: must be positive (got -1)'
    """

    def __init__(self, field: str, problem: str, value: Any = None) -> None:
        got = "" if value is None else f" (got {value!r})"
        super().__init__(f"{field}: {problem}{got}")
        self.field = field
        self.problem = problem
        self.value = value
