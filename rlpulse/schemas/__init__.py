"""rlpulse schemas: the metric catalog, mergeable values and the wire protocol."""

from rlpulse.schemas.catalog import Catalog, Entry, Resolved, Template
from rlpulse.schemas.errors import SchemaError
from rlpulse.schemas.metrics import CATALOG
from rlpulse.schemas.reductions import Reduction, Stat
from rlpulse.schemas.values import Summary

__all__ = [
    "CATALOG",
    "Catalog",
    "Entry",
    "Reduction",
    "Resolved",
    "SchemaError",
    "Stat",
    "Summary",
    "Template",
]
