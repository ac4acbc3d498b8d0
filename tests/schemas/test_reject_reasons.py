"""REJECT_REASONS is the whole list: every reason the protocol raises a SchemaError with, and
every reason the collector's receiver counts a reject under, and nothing else (issue 17,
item 6: the list is spelled once and exported at 0 from start-up)."""

from __future__ import annotations

import ast
from pathlib import Path

from rlpulse.schemas.errors import REJECT_REASONS

ROOT = Path(__file__).resolve().parents[2]


def literal_first_args(path: Path, called: str) -> set[str]:
    """The string-literal first arguments of every call to ``called`` (a name or attribute)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        first = node.args[0]
        if name == called and isinstance(first, ast.Constant) and isinstance(first.value, str):
            found.add(first.value)
    return found


def test_reject_reasons_are_exactly_those_raised_and_counted() -> None:
    raised = set().union(
        *(literal_first_args(path, "SchemaError") for path in (ROOT / "schemas").glob("*.py")),
        *(literal_first_args(path, "SchemaError") for path in (ROOT / "collector").rglob("*.py")),
    )
    counted = set().union(
        *(literal_first_args(path, "reject") for path in (ROOT / "collector").rglob("*.py"))
    )
    assert raised, "no SchemaError found: the scan is broken"
    assert raised | counted == set(REJECT_REASONS)
    assert len(REJECT_REASONS) == len(set(REJECT_REASONS))
