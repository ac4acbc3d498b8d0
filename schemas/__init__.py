"""rlpulse schemas: the metric catalog, mergeable values and the wire protocol."""

from schemas.catalog import Catalog, Entry, Resolved, Template
from schemas.errors import SchemaError
from schemas.metrics import CATALOG
from schemas.reductions import Reduction, Stat
from schemas.values import Summary

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
