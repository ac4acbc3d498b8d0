"""The producer's environment variables, read in this one place."""

from __future__ import annotations

import os
from collections.abc import Mapping

ADDRESS_VAR = "RLPULSE_ADDRESS"
"""Collector address for workers that are not told one (Ray actors inherit it via runtime_env)."""
DEFAULT_ADDRESS = "tcp://127.0.0.1:5555"


def default_address(environ: Mapping[str, str] = os.environ) -> str:
    return environ.get(ADDRESS_VAR) or DEFAULT_ADDRESS
