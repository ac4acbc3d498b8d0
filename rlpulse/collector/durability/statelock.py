"""One collector per ``state_dir``: an exclusive lock on ``state_dir/lock`` for the process's life.

Two collectors writing one ``state_dir`` interleave their checkpoints, logs and marks, and the
next start recovers from a mix of both. The lock is a ``flock`` on an open file: the kernel
drops it when the process exits, however it exits (``kill -9`` included), so a lock file left
behind by a dead process is taken over at the next start; the file only says who held it
last (its pid, for the error message).

>>> import tempfile
>>> lock = StateLock(tempfile.mkdtemp())
>>> lock.release(); lock.release()
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from rlpulse.schemas.errors import ConfigError

LOCK_FILE = "lock"


class StateDirInUse(ConfigError):
    """Another live process holds ``state_dir`` (the CLI exits with status 2)."""

    def __init__(self, path: Path, holder: str) -> None:
        super().__init__(
            "state_dir",
            f"{path.parent} is in use by another collector or relay ({holder}; lock {path}): "
            "give each collector its own state_dir, or stop the other one first",
        )
        self.path = path


class StateLock:
    """Holds the lock on ``directory`` until :meth:`release` or the process's end; raises
    :class:`StateDirInUse` when a live process holds it. The descriptor is not inherited by
    programs this process starts (``O_CLOEXEC``)."""

    def __init__(self, directory: str | Path) -> None:
        self.path = Path(directory) / LOCK_FILE
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
            os.close(fd)
            raise StateDirInUse(self.path, f"pid {holder}" if holder else "pid unknown") from None
        except OSError:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd: int | None = fd

    def release(self) -> None:
        """Let another process take ``state_dir``; safe to call twice."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                os.close(fd)  # closing the only descriptor drops the flock
