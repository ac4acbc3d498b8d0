"""Polling until a condition holds: :func:`until` answers whether it did in time,
:func:`eventually` fails the test saying what never happened."""

from __future__ import annotations

import time
from collections.abc import Callable


def until(predicate: Callable[[], bool], timeout_s: float = 10.0, poll_s: float = 0.005) -> bool:
    """Whether ``predicate()`` became true within ``timeout_s`` (checked every ``poll_s``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll_s)
    return False


def eventually(
    check: Callable[[], bool], what: str, timeout: float = 20.0, poll_s: float = 0.1
) -> None:
    """Wait until ``check()`` is true; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(poll_s)
