"""The producer's name table: what each logged name is sent as, resolved once per name.

The first time a name reaches the sender thread, :meth:`Names.code` checks it against the
collector's limits, resolves it in the catalog (``Catalog.resolve``: the reduction code to
send; the collector's catalog still decides the merge, "Who decides" in
``rlpulse.schemas.catalog``) and keeps the code; every later entry reads the code from
:attr:`Names.codes`, a plain dict lookup. A name the collector would refuse gets
``BAD_NAME`` (warned about once here, counted by the encoder).

A near miss warns once: a name outside the catalog within one or two letters of a catalog
name (``actor/pg_los`` for ``actor/pg_loss``, the rule in ``Catalog.near_miss``) is still
logged under the user's own name, as a new metric, but the producer warns once, naming the
catalog name it resembles. A name the user declared a reduction for
(``Producer(reductions=...)``) is taken as meant and never warned about.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from rlpulse.schemas.catalog import Catalog
from rlpulse.schemas.messages import DEFAULT_LIMITS, Limits
from rlpulse.schemas.reductions import Reduction

BAD_NAME = -1
"""The code of a name the collector would refuse."""
CACHED_NAMES = 100_000
"""Names whose code is kept, at most; past that a name is resolved (and checked) again at
each entry."""


class Names:
    """Reduction codes by name, each resolved once (:meth:`code`).

    >>> # names = Names(CATALOG, {}, warn_once); names.code("actor/pg_loss")
    """

    def __init__(
        self,
        catalog: Catalog,
        declared: Mapping[str, Reduction],
        warn_once: Callable[[str, str], None],
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        self.catalog = catalog
        self.declared = declared
        self.warn_once = warn_once
        self.limits = limits
        self.codes: dict[str, int] = {}
        """Reduction code by name, ``BAD_NAME`` for a name the collector would refuse."""

    def code(self, name: object) -> int:
        """The reduction code of a name first seen, or ``BAD_NAME`` (counted by the caller,
        warned about here) when no collector would take it."""
        if type(name) is not str or not name:
            self.warn_once(
                f"name:{name!r:.80}", f"metric names must be non-empty strings, got {name!r:.80}"
            )
            return BAD_NAME
        longest = self.limits.max_name_length
        if len(name) > longest or not _encodable(name):
            self.warn_once(
                "name-limit",
                f"metric names must be UTF-8 strings of at most {longest} characters (the "
                f"collector's limit): {name!r:.80} and any like it are dropped (counted as "
                "invalid)",
            )
            code = BAD_NAME
        else:
            declared = self.declared.get(name)
            code = int(self.catalog.resolve(name, declared).reduction)
            if declared is None and len(self.codes) < CACHED_NAMES:
                self._near_miss(name)
        if len(self.codes) < CACHED_NAMES:
            self.codes[name] = code
        return code

    def _near_miss(self, name: str) -> None:
        """Warn once about a name one or two letters off a catalog name."""
        near = self.catalog.near_miss(name)
        if near is not None:
            self.warn_once(
                f"near:{name}",
                f"{name!r} is not in the metric catalog, and resembles the catalog's "
                f"{near!r}: it is logged as a new metric under its own name (a typo? spell "
                "catalog names through rlpulse.schemas.metrics; or declare it with "
                "Producer(reductions=...) to say it is meant)",
            )


def _encodable(name: str) -> bool:
    """Whether msgpack can carry ``name`` (a lone surrogate cannot be UTF-8 encoded)."""
    if name.isascii():
        return True
    try:
        name.encode()
    except UnicodeEncodeError:
        return False
    return True
