"""Errors raised by the schemas package."""

from __future__ import annotations

from typing import Any


class SchemaError(ValueError):
    """A message, value or name that does not follow the catalog or the wire protocol.

    ``reason`` is a short stable token (``"bad_version"``, ``"bad_values"``...) that the
    collector counts rejects by; ``detail`` says in words what was wrong.

    >>> SchemaError("bad_version", "protocol version 7 is not supported").reason
    'bad_version'
    """

    def __init__(self, reason: str, detail: str, data: Any = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.data = data
