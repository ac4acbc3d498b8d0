"""A free loopback port, for a server a test starts."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the kernel's pick; free again when
    this returns, so another process may in principle take it first)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
