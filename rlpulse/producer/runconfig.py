"""``Producer.run_config``'s checks: a framework's config made plain data and bounded, what is
left out counted and said (``rlpulse.schemas.runconfig`` owns what plain data is).

>>> from rlpulse.producer.stats import Counters
>>> c, said = Counters(), []
>>> len(prepare({"lr": 1e-6, "fn": print}, c, lambda key, text: said.append(text))), c.invalid
(13, 1)
>>> said
['run_config(): 1 value is no plain data (strings, numbers, booleans, lists, maps) and is left out: fn']
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from rlpulse.producer.stats import Counters
from rlpulse.schemas import runconfig

SHOWN = 5
"""Left-out keys a warning names."""


def prepare(
    config: Mapping[str, Any], counters: Counters, warn_once: Callable[[str, str], None]
) -> bytes | None:
    """``config`` encoded for the hello; None when it cannot be sent (not a mapping, or too
    large). Each value left out, and a config refused, counts one ``invalid``."""
    if not isinstance(config, Mapping):
        counters.invalid += 1
        warn_once("config:type", f"run_config() takes a mapping, not a {type(config).__name__}")
        return None
    cleaned = runconfig.clean(config)
    left = cleaned.left_out
    if left:
        counters.invalid += len(left)
        more = f" and {len(left) - SHOWN} more" if len(left) > SHOWN else ""
        one = len(left) == 1
        warn_once(
            "config:left-out",
            f"run_config(): {len(left)} {'value is' if one else 'values are'} no plain data "
            f"(strings, numbers, booleans, lists, maps) and {'is' if one else 'are'} left out: "
            f"{', '.join(left[:SHOWN])}{more}",
        )
    data = runconfig.encode(cleaned.values)
    if len(data) > runconfig.MAX_BYTES:
        counters.invalid += 1
        big = ", ".join(f"{k} ({n} bytes)" for k, n in runconfig.largest(cleaned.values))
        warn_once(
            "config:size",
            f"run_config(): the config takes {len(data)} bytes encoded, more than the "
            f"{runconfig.MAX_BYTES} a hello may carry; not sent (largest parts: {big})",
        )
        return None
    return data
