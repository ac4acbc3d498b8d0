"""The files of ``state_dir`` as data: JSON written all or nothing, read back or refused
naming the file and the fix (:class:`StateError`), and the outbox's record format.

>>> decode_record(encode_record(7, StepRecord(run="r", step=3, metrics={})))[0]
7
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from rlpulse.schemas.errors import ConfigError
from rlpulse.schemas.record import RunForgotten, StepRecord


class StateError(ConfigError):
    """``state_dir`` holds damaged state the collector will not start from: the message names
    the file and what to do (the CLI exits with status 2, as for a bad configuration).

    >>> str(StateError("/s/checkpoint.json is not valid JSON")).startswith("state_dir: /s/")
    True
    """

    def __init__(self, problem: str) -> None:
        super().__init__("state_dir", problem)


def move_aside(state_dir: Path) -> str:
    return (
        f"to start with empty state, move the state directory aside (mv {state_dir} "
        f"{state_dir}.damaged): the steps that were open in it are then lost"
    )


def write_json_atomic(path: Path, obj: object, fsync: bool = False) -> None:
    """Replace ``path`` with ``obj`` as JSON, all or nothing. Raises ``OSError`` (a full disk)
    with ``path`` unchanged and no temporary file left behind."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        with tmp.open("w") as f:
            f.write(json.dumps(obj))
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def encode_record(seq: int, record: StepRecord | RunForgotten) -> bytes:
    return record.encode(seq=seq, emitted_at=time.time())


def decode_record(payload: bytes) -> tuple[int, float, Any]:
    """An outbox record: a step for the sinks, a run they may forget (``RunForgotten``), or
    (a relay's) a record for the collector above."""
    obj = json.loads(payload)
    if "forgotten" in obj:
        return int(obj["seq"]), float(obj["emitted_at"]), RunForgotten(str(obj["forgotten"]))
    if "relay" in obj:
        from rlpulse.collector.tiers.relay import RelayRecord

        return int(obj["seq"]), float(obj["emitted_at"]), RelayRecord.from_json(obj["relay"])
    return int(obj["seq"]), float(obj["emitted_at"]), StepRecord.from_json(obj["record"])


def load_json(path: Path, what: str, fix: str) -> Any:
    """The JSON in ``path`` (None if there is no such file); a StateError naming it and the
    fix when it does not parse."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateError(f"cannot read {what} {path} ({exc.strerror}); {fix}") from None
    try:
        return json.loads(data)
    except ValueError as exc:
        raise StateError(f"{what} {path} is damaged (not valid JSON: {exc}); {fix}") from None
