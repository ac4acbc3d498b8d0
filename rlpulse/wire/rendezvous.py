"""How producers and collectors find each other: the default address, and the names of the
collectors ``rlpulse.collector.onray`` runs on Ray (which producers look up). Spelled here
once, below both packages."""

from __future__ import annotations

DEFAULT_ADDRESS = "tcp://127.0.0.1:5555"
"""Where a collector listens, and producers connect, unless told otherwise (loopback)."""

RAY_NAMESPACE = "rlpulse"
"""The Ray namespace of the collectors ``rlpulse.collector.onray`` starts."""


def relay_actor_name(job_id: str, node_id: str) -> str:
    """The name of the relay ``rlpulse.collector.onray`` runs for a Ray job on a node."""
    return f"relay-{job_id}-{node_id}"
