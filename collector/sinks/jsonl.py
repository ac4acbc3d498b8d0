"""``jsonl``: one JSON object per emitted step, appended and flushed as it is written.

Each line is :meth:`StepRecord.to_json`:
``{"run": ..., "step": ..., "metrics": {name: value}, "partial": bool, "missing": [...], ...}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from collector.errors import ConfigError
from collector.sinks.base import SinkContext
from schemas.record import StepRecord


class JsonlSink:
    """Appends steps to ``path`` (parent folders are created).

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "out.jsonl")
    >>> sink = JsonlSink(path); sink.open()
    >>> sink.write(StepRecord(run="r", step=0, metrics={"x": 1.0})); sink.close()
    >>> json.loads(open(path).read())["metrics"]
    {'x': 1.0}
    """

    name = "jsonl"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._file: IO[str] | None = None

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any], ctx: SinkContext) -> JsonlSink:
        unknown = sorted(set(kwargs) - {"path"})
        if unknown:
            raise ConfigError(f"tracker_kwargs.jsonl.{unknown[0]}", "unknown key; jsonl takes path")
        path = kwargs.get("path")
        if not isinstance(path, str) or not path:
            raise ConfigError(
                "tracker_kwargs.jsonl.path", "is required: the file to append steps to", path
            )
        return cls(path)

    def open(self) -> None:
        if self._file is not None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8")
        except OSError as exc:
            raise ConfigError(
                "tracker_kwargs.jsonl.path",
                f"cannot open for appending: {exc.strerror}",
                str(self.path),
            ) from None

    def write(self, record: StepRecord) -> None:
        if self._file is None:
            self.open()
        assert self._file is not None
        self._file.write(
            json.dumps(record.to_json(), allow_nan=False, separators=(",", ":")) + "\n"
        )
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
