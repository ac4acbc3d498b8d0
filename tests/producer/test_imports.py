"""The producer's modules import one another one way: no cycle, not even through an import
inside a function (a cycle hidden that way still ties the modules together)."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import rlpulse.producer

PACKAGE = "rlpulse.producer"


def imports_of(path: Path) -> set[str]:
    """The sibling modules ``path`` imports, at the top or anywhere inside it."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == PACKAGE:
                out.update(alias.name for alias in node.names)
            elif node.module.startswith(PACKAGE + "."):
                out.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PACKAGE + "."):
                    out.add(alias.name.split(".")[2])
    return out


def test_the_producer_modules_have_no_import_cycle() -> None:
    root = Path(rlpulse.producer.__file__).parent
    graph = {path.stem: imports_of(path) for path in root.glob("*.py")}
    assert graph["reduce"].isdisjoint({"device", "deferred"})
    try:
        order = list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        raise AssertionError(f"import cycle: {' -> '.join(exc.args[1])}") from None
    assert order.index("reduce") < order.index("deferred") < order.index("device")
