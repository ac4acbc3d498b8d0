"""Test-session guard: rlpulse's packages are imported as ``rlpulse.<name>`` only.

From the repository root the folders ``producer/``, ``collector/``... are also importable
as top-level modules, which would load a second copy of the code beside ``rlpulse.*`` (and
hide a wrong import that an installed wheel would fail on). Importing them so is an error.
"""

from __future__ import annotations

import importlib.abc
import sys

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
