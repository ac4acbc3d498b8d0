"""Two "nodes" on one machine, for what needs a second host: two network namespaces, each
with its own loopback, joined by a veth pair on a private /24 that routes nowhere else. A
process in one reaches the other only through the other's veth address, as a worker on
another machine reaches a collector's reachable bind (127.0.0.1 there is its own).

Needs root (``ip link add ... netns``, ``nsenter``), as the test suite's own namespace has
(scripts/in-netns.sh). Both ends of the pair are created inside the two new namespaces, never
in the caller's, and vanish with them.

>>> # with two_nodes() as (collector_node, worker_node):
>>> #     collector_node.popen([...]); worker_node.run([...]); collector_node.address
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

SUBNET = "10.45.0"
"""The pair's private network (``10.45.0.1`` and ``10.45.0.2``)."""


@dataclass(frozen=True)
class Node:
    """A network namespace held open by a ``sleep`` process; ``address`` is its veth's."""

    holder: subprocess.Popen[bytes]
    address: str

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this node's network namespace (the rest is shared)."""
        return ["nsenter", "-t", str(self.holder.pid), "-n", "--", *argv]

    def run(self, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        return subprocess.run(self.command(argv), **kwargs)

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        return subprocess.Popen(self.command(argv), **kwargs)


def why_not() -> str | None:
    """Why two nodes cannot be made here (None when they can)."""
    for tool in ("unshare", "nsenter", "ip"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    probe = subprocess.run(["unshare", "-n", "--", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        return "cannot make a network namespace here (needs root: scripts/run-tests.sh)"
    return None


@contextmanager
def two_nodes() -> Iterator[tuple[Node, Node]]:
    """Two nodes, ``10.45.0.1`` and ``10.45.0.2``, each with its loopback up; every process
    started in them must be ended by the caller before the block ends."""
    with ExitStack() as stack:
        holders = []
        for _ in range(2):
            holder = subprocess.Popen(["unshare", "-n", "--", "sleep", "3600"])
            stack.callback(holder.wait)
            stack.callback(holder.kill)
            holders.append(holder)
        a, b = (str(h.pid) for h in holders)
        # unshare execs sleep in the same process once the namespace is made: wait for that.
        ours, deadline = os.readlink("/proc/self/ns/net"), time.monotonic() + 10
        while any(os.readlink(f"/proc/{pid}/ns/net") == ours for pid in (a, b)):
            assert time.monotonic() < deadline, "unshare -n did not make a namespace"
            time.sleep(0.01)
        subprocess.run(
            ["ip", "link", "add", "v45a", "netns", a, "type", "veth", "peer", "v45b", "netns", b],
            check=True,
        )
        nodes = []
        for holder, link, host in ((holders[0], "v45a", 1), (holders[1], "v45b", 2)):
            node = Node(holder, f"{SUBNET}.{host}")
            script = (
                f"ip link set lo up && ip addr add {node.address}/24 dev {link} "
                f"&& ip link set {link} up"
            )
            node.run(["sh", "-c", script], check=True)
            nodes.append(node)
        yield nodes[0], nodes[1]
