"""A full disk, for real: a small tmpfs mounted for the test (root only; the test skips
elsewhere), and filling it to the last byte."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_disk(path: Path, size: str = "1m") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` for the test."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    path.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(disk: Path) -> Path:
    """Fill ``disk`` to the last byte; return the file to delete to free it."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as f:
        for chunk in (1 << 16, 1 << 12, 1 << 9, 1):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    return filler
