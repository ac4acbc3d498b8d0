"""Errors raised by the collector at start-up."""

from __future__ import annotations

from typing import Any


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
