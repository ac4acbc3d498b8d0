"""``jsonl``: one JSON object per emitted step, appended and flushed as it is written.

Each line is :meth:`StepRecord.to_json`:
``{"run": ..., "step": ..., "metrics": {name: value}, "partial": bool, "missing": [...], ...}``.

A write is a whole line or nothing: a failed one (a full disk) is cut back out of the file
before the error is raised, so the fan-out's retry writes the step once, not a torn line and
then the step again.

Log rotation: SIGHUP reopens the file (``reopen``), before the next step; a file renamed
without it (``logrotate``'s default rename, no ``postrotate``) is noticed within a second
(``base.RenameCheck``) and the next step goes to a new file at ``path``. Either happens
between two steps, so each step is in one file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from rlpulse.collector.sinks.base import (
    RenameCheck,
    Sink,
    SinkContext,
    reject_unknown,
    renamed,
    required_path,
)
from rlpulse.schemas.errors import ConfigError
from rlpulse.schemas.record import StepRecord

log = logging.getLogger("rlpulse.collector.jsonl")
TAIL_BYTES = 4 * 1024 * 1024


class JsonlSink(Sink):
    """Appends steps to ``path`` (parent folders are created).

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "out.jsonl")
    >>> sink = JsonlSink(path); sink.open()
    >>> sink.write(StepRecord(run="r", step=0, metrics={"x": 1.0})); sink.close()
    >>> json.loads(open(path).read())["metrics"]
    {'x': 1.0}
    """

    name = "jsonl"
    PATHS: ClassVar[tuple[str, ...]] = ("path",)

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None
        self._dirty: int | None = None
        self._check = RenameCheck()
        """After a failed write that could not be cut back: the size to cut the file to."""

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any], ctx: SinkContext) -> JsonlSink:
        reject_unknown(kwargs, ("path",), "tracker_kwargs.jsonl")
        return cls(
            required_path(kwargs, "path", "tracker_kwargs.jsonl", "the file to append steps to")
        )

    def open(self) -> None:
        if self._fd is not None:
            return
        try:
            self._open()
        except OSError as exc:
            raise ConfigError(
                "tracker_kwargs.jsonl.path",
                f"cannot open for appending: {exc.strerror}",
                str(self.path),
            ) from None

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._repair()
        # Unbuffered: a line that fails is never left in a buffer to be written again.
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._dirty = None

    def reopen(self) -> None:
        """Close the file and open ``path`` again (SIGHUP after a rotation). Raises
        ``OSError`` when it cannot (the fan-out counts it; the next step tries again)."""
        self.close()
        self._open()
        log.info("%s: reopened", self.path)

    def _repair(self) -> None:
        """Cut a torn last line (the collector was killed mid-write) so appends stay valid."""
        if not self.path.exists():
            return
        with self.path.open("r+b") as f:
            size = f.seek(0, os.SEEK_END)
            if size == 0:
                return
            f.seek(max(0, size - TAIL_BYTES))
            tail = f.read()
            if tail.endswith(b"\n"):
                return
            cut = tail.rfind(b"\n")
            keep = size - len(tail) + cut + 1 if cut >= 0 else (0 if size <= TAIL_BYTES else size)
            f.truncate(keep)
            log.warning("%s: cut a torn last line of %d bytes", self.path, size - keep)

    def written_through(self) -> dict[str, int]:
        """The last step of each run already in the file (read from its tail), so a restarted
        collector does not write a step twice."""
        if not self.path.exists():
            return {}
        with self.path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - TAIL_BYTES))
            lines = f.read().split(b"\n")
        out: dict[str, int] = {}
        for line in lines[1:] if size > TAIL_BYTES else lines:
            try:
                obj = json.loads(line)
                out[obj["run"]] = max(out.get(obj["run"], -1), int(obj["step"]))
            except (ValueError, KeyError, TypeError):
                continue
        return out

    def write(self, record: StepRecord) -> None:
        """Append one line; on ``OSError`` the file is as before the call (see the module
        docstring)."""
        if self._fd is None:
            self.open()
        elif self._dirty is None and self._check.due() and renamed(self.path, self._fd):
            self.reopen()
        fd = self._fd
        assert fd is not None
        if self._dirty is not None:
            os.ftruncate(fd, self._dirty)  # what a failed write left (raises if it still fails)
            self._dirty = None
        line = record.encode() + b"\n"
        start = os.fstat(fd).st_size
        done = 0
        try:
            while done < len(line):
                done += os.write(fd, line[done:])
        except OSError:
            self._dirty = start
            with contextlib.suppress(OSError):  # shrinking works on a full disk
                os.ftruncate(fd, start)
                self._dirty = None
            raise

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
