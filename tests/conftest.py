"""Test-session guard and the fixtures every folder shares.

rlpulse's packages are imported as ``rlpulse.<name>`` only: from the repository root the
folders ``producer/``, ``collector/``... are also importable as top-level modules, which would
load a second copy of the code beside ``rlpulse.*`` (and hide a wrong import that an installed
wheel would fail on). Importing them so is an error.

Helpers that are plain functions (a free port, waiting, scraping) are in ``tests/support/``.
"""

from __future__ import annotations

import importlib.abc
import sys
from pathlib import Path

import pytest

from tests.certs import self_signed_pair

LEGACY = frozenset(("producer", "collector", "schemas", "runtools", "trainer", "deploy", "wire"))


class _LegacyImport(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
        if path is None and fullname.split(".")[0] in LEGACY:
            raise ImportError(
                f"import rlpulse.{fullname}, not {fullname}: rlpulse's packages live in the "
                "rlpulse namespace"
            )
        return None


sys.meta_path.insert(0, _LegacyImport())


@pytest.fixture(scope="session")
def tls_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed ``(cert.pem, key.pem)`` for 127.0.0.1, made once per session (the test
    skips without openssl)."""
    return self_signed_pair(tmp_path_factory.mktemp("tls"))
