"""OnImport: a framework's module wrapped once it is imported (the verl and ROLL hooks)."""

from __future__ import annotations

import sys
from pathlib import Path

from rlpulse.producer.integrations.onimport import OnImport


def test_two_hooks_waiting_for_one_module_both_see_it(tmp_path: Path, monkeypatch) -> None:
    """verl's phase hook and its engine hook both wait for verl's agent loop module: each
    handed the import to the other, for ever (RecursionError in every Ray worker)."""
    (tmp_path / "rlpulse_onimport_probe.py").write_text("VALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[tuple[str, int]] = []
    first = OnImport(["rlpulse_onimport_probe"], lambda m: seen.append(("first", m.VALUE)))
    second = OnImport(["rlpulse_onimport_probe"], lambda m: seen.append(("second", m.VALUE)))
    first.install()
    second.install()
    try:
        import rlpulse_onimport_probe  # noqa: F401

        assert sorted(seen) == [("first", 7), ("second", 7)]
    finally:
        first.uninstall()
        second.uninstall()
        sys.modules.pop("rlpulse_onimport_probe", None)
