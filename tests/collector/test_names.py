"""A run's name table resolves each name once (the producer's code kept per row, the catalog
consulted on first sight only), says which reduction wins on a disagreement and counts it."""

from __future__ import annotations

from rlpulse.collector.health import Health
from rlpulse.collector.runs.names import NameTable
from rlpulse.schemas.catalog import Resolved
from rlpulse.schemas.messages import Table
from rlpulse.schemas.metrics import CATALOG
from rlpulse.schemas.reductions import Reduction

MEAN, MAX = int(Reduction.MEAN), int(Reduction.MAX)


class CountingCatalog:
    """The catalog, counting its lookups by name."""

    def __init__(self) -> None:
        self.lookups: dict[str, int] = {}

    def resolve(self, name: str, declared: Reduction | None = None) -> Resolved:
        self.lookups[name] = self.lookups.get(name, 0) + 1
        return CATALOG.resolve(name, declared)


def table(*rows: tuple[str, int]) -> Table:
    return Table.shared(tuple(n for n, _ in rows), bytes(k for _, k in rows))


def test_each_name_is_looked_up_once_whatever_tables_carry_it() -> None:
    catalog = CountingCatalog()
    names = NameTable("r", catalog=catalog, health=Health(), max_names=100)  # type: ignore[arg-type]
    names.layout(table(("critic/loss", MEAN), ("my/own", MAX)))
    names.layout(table(("my/own", MAX), ("critic/loss", MEAN), ("other/x", MEAN)))
    names.layout(table(("critic/loss", MEAN)))
    assert catalog.lookups == {"critic/loss": 1, "my/own": 1, "other/x": 1}
    assert names.resolved[names.index["my/own"]].reduction is Reduction.MAX  # as sent


def test_a_disagreement_is_counted_and_the_catalog_wins() -> None:
    health = Health()
    catalog = CountingCatalog()
    names = NameTable("r", catalog=catalog, health=health, max_names=100)  # type: ignore[arg-type]
    assert CATALOG.resolve("critic/loss").reduction is Reduction.MEAN
    names.layout(table(("critic/loss", MAX)))  # an older producer's code
    assert health.kind_mismatch == 1
    assert names.resolved[names.index["critic/loss"]].reduction is Reduction.MEAN
    names.layout(table(("critic/loss", MAX), ("b", MEAN)))  # the same code again: counted
    names.layout(table(("critic/loss", MEAN), ("c", MEAN)))  # agreeing: not counted
    assert health.kind_mismatch == 2
    assert catalog.lookups["critic/loss"] == 1
