"""What a decoded message must satisfy beyond what its types say, for both protocol versions:
the collector's limits, a declared topology, a registered endpoint, the counters of a stats
map, and the name tables of a hello (one bad table is left out, not the whole hello).
``rlpulse.schemas.protocol`` (version 2) and ``rlpulse.schemas.protocol_v1`` both check
through here; each raises :class:`~rlpulse.schemas.errors.SchemaError` naming what is wrong.

>>> checked_roles({"actor_train": 8}, 128)
{'actor_train': 8}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from rlpulse.schemas.endpoint import MetricsUrl
from rlpulse.schemas.errors import SchemaError
from rlpulse.schemas.messages import (
    RELAY_STAT_KEYS,
    STAT_KEYS,
    Bye,
    Delta,
    Done,
    Heartbeat,
    Hello,
    Limits,
    Message,
    Metrics,
    RelayHello,
    Table,
)


def checked_stats(raw: Mapping[str, Any]) -> dict[str, int]:
    """The known counters of a stats map (missing ones read as 0, unknown ones are left; a
    relay's own, ``RELAY_STAT_KEYS``, only where present)."""
    out: dict[str, int] = {}
    for key in (*STAT_KEYS, *(k for k in RELAY_STAT_KEYS if k in raw)):
        value = raw.get(key, 0)
        if type(value) is not int or value < 0:
            raise SchemaError(
                "bad_field", f"stat {key!r} must be a non-negative integer, got {value!r:.80}"
            )
        out[key] = value
    return out


def checked_roles(raw: object, limit: int) -> dict[str, int]:
    """A declared topology: at most 64 role names, each with a world size."""
    if not isinstance(raw, dict) or len(raw) > 64:
        raise SchemaError(
            "bad_field", "roles must be a map of at most 64 role names to world sizes"
        )
    for role, ws in raw.items():
        if (
            type(role) is not str
            or not 0 < len(role) <= limit
            or type(ws) is not int
            or not 1 <= ws <= 1 << 24
        ):
            raise SchemaError(
                "bad_field",
                f"roles: {role!r:.40} -> {ws!r:.20} is not a role name and a world size",
            )
    return raw


def valid_tables(
    msg: Hello | RelayHello, limits: Limits, problems: list[SchemaError] | None
) -> Hello | RelayHello:
    """``msg`` without the tables that break the limits, each reported in ``problems``: one
    bad name must not cost the producer its other tables (entries of a table left out are
    then counted ``bad_table``, one by one)."""
    if len({t.id for t in msg.tables}) != len(msg.tables):
        raise SchemaError("bad_field", "a hello declares the same table number twice")
    bad: set[int] = set()
    for decl in msg.tables:
        try:
            Table.checked(decl.names, decl.kinds, limits)
        except SchemaError as exc:
            bad.add(decl.id)
            if problems is not None:
                problems.append(SchemaError(exc.reason, f"table {decl.id}: {exc.detail}", decl.id))
    if not bad:
        return msg
    return msgspec.structs.replace(msg, tables=[t for t in msg.tables if t.id not in bad])


def checked(msg: Message, limits: Limits, problems: list[SchemaError] | None) -> Message:
    """A version-2 message as decoded, checked for what the structs' types cannot say:
    limits, and the tables of a hello (those that break the limits left out, each reported
    in ``problems``)."""
    if type(msg) is Metrics:
        if not 0 < len(msg.entries) <= limits.max_entries:
            raise SchemaError(
                "bad_envelope", f"a metrics message holds 1..{limits.max_entries} entries"
            )
        return checked_incomplete(msg, limits)
    if type(msg) is Hello:
        lab = limits.max_label_length
        for what, value, limit in (
            ("run name", msg.run, lab),
            ("role", msg.role, lab),
            ("host name", msg.host, 255),
        ):
            if not 0 < len(value) <= limit:
                raise SchemaError(
                    "bad_field", f"{what} must be 1..{limit} characters, got {value!r:.80}"
                )
        if msg.rank >= msg.world_size:
            raise SchemaError(
                "bad_field", f"rank {msg.rank} is not below world size {msg.world_size}"
            )
        checked_roles(msg.expected, lab)
        checked_endpoint(msg.metrics_url, msg.logs)
        return valid_tables(msg, limits, problems)
    if type(msg) is RelayHello:
        for member in msg.members:
            lab = limits.max_label_length
            if not (0 < len(member.run) <= lab and 0 < len(member.role) <= lab):
                raise SchemaError("bad_field", "a member's run and role must be 1..128 characters")
            if member.rank >= member.world_size:
                raise SchemaError("bad_field", "a member's rank is not below its world size")
            checked_endpoint(member.metrics_url, member.logs)
        return valid_tables(msg, limits, problems)
    if type(msg) is Delta:
        lab = limits.max_label_length
        if not len(msg.run) <= lab:
            raise SchemaError("bad_field", "a delta's run name is too long")
        for _, span in msg.spans:
            if max(len(span.role), len(span.cluster), len(span.phase), len(span.host)) > 255:
                raise SchemaError("bad_field", "a span's role, phase or host is too long")
        return checked_incomplete(msg, limits)
    if type(msg) is Heartbeat:
        stats = checked_stats(msg.stats)
        return Heartbeat(msg.producer, msg.seq, stats, msg.flush, msg.sent)
    if type(msg) is Bye:
        checked_incomplete(msg, limits)
        return Bye(msg.producer, msg.seq, checked_stats(msg.stats), msg.incomplete)
    if type(msg) is Done:
        return checked_incomplete(msg, limits)
    return msg


def checked_incomplete(msg: Metrics | Done | Bye | Delta, limits: Limits) -> Message:
    """A message's ``incomplete`` steps are at most ``max_entries``: each may open a step."""
    if len(msg.incomplete) > limits.max_entries:
        raise SchemaError(
            "bad_field", f"a message names at most {limits.max_entries} incomplete steps"
        )
    return msg


def checked_endpoint(metrics_url: str, logs: bool) -> None:
    """A registered metrics URL is well formed; a producer that logs nothing registers one."""
    if metrics_url:
        MetricsUrl.parse(metrics_url)
    elif not logs:
        raise SchemaError("bad_field", "a producer that logs nothing must register a metrics URL")
