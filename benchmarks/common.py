"""Helpers shared by the benchmarks: statistics, machine load, files, ports."""

from __future__ import annotations

import json
import math
import os
import re
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
"""Raw JSON of the latest run, one file per benchmark (rendered by ``benchmarks.report``)."""


def summarize(samples: Sequence[float]) -> dict[str, float]:
    """Median, p99, max and count of ``samples`` (nearest-rank percentiles)."""
    xs = sorted(samples)
    n = len(xs)
    if n == 0:
        return {"n": 0, "median": math.nan, "p99": math.nan, "max": math.nan}
    return {
        "n": n,
        "median": percentile(xs, 50),
        "p99": percentile(xs, 99),
        "max": xs[-1],
        "mean": sum(xs) / n,
    }


def percentile(sorted_xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    if not sorted_xs:
        return math.nan
    k = max(0, min(len(sorted_xs) - 1, math.ceil(q / 100 * len(sorted_xs)) - 1))
    return sorted_xs[k]


def median(xs: Sequence[float]) -> float:
    return percentile(sorted(xs), 50)


class CpuSteal:
    """Share of CPU time the hypervisor stole and the machine spent busy, between two reads
    of ``/proc/stat`` (Linux only; zeros elsewhere)."""

    def __init__(self) -> None:
        self._start = self._read()

    @staticmethod
    def _read() -> list[int]:
        try:
            with open("/proc/stat") as f:
                fields = f.readline().split()[1:]
            return [int(x) for x in fields]
        except OSError:
            return []

    def since_start(self) -> dict[str, float]:
        end = self._read()
        if not end or not self._start:
            return {"steal": 0.0, "busy": 0.0}
        d = [b - a for a, b in zip(self._start, end, strict=False)]
        total = sum(d[:8]) or 1
        idle = d[3] + d[4]
        steal = d[7] if len(d) > 7 else 0
        return {"steal": steal / total, "busy": (total - idle) / total}


def load_snapshot() -> dict[str, Any]:
    """Load average and wall time, for the "how loaded was the machine" line."""
    one, five, fifteen = os.getloadavg()
    return {"time": time.time(), "load1": one, "load5": five, "load15": fifteen}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_json(name: str, data: dict[str, Any], out_dir: Path = RESULTS) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(data, indent=1, sort_keys=True, default=float))
    return path


_STEP = re.compile(rb'"step":(\d+)')


class JsonlTail:
    """Follows a jsonl sink file; ``poll()`` returns the steps of lines completed since the
    last call (cheap: a read of the new bytes and a regex on each line's head)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f: Any = None
        self._rest = b""
        self.lines = 0

    def poll(self) -> list[int]:
        if self._f is None:
            try:
                self._f = open(self.path, "rb")  # noqa: SIM115 - kept open across polls
            except FileNotFoundError:
                return []
        chunk = self._f.read()
        if not chunk:
            return []
        data = self._rest + chunk
        *complete, self._rest = data.split(b"\n")
        steps = []
        for line in complete:
            m = _STEP.search(line, 0, 400)
            if m:
                steps.append(int(m.group(1)))
        self.lines += len(complete)
        return steps

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def spin_cycles_per_ms(torch: Any) -> float:
    """How many cycles of ``torch.cuda._sleep`` (a spin kernel) make one millisecond on this
    GPU. The clock is woken first: an idle GPU runs slow and speeds up under load, and a spin
    calibrated cold ran "300 ms" in 217 on an H100."""
    torch.cuda._sleep(200_000_000)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(100_000_000)
    end.record()
    end.synchronize()
    return 100_000_000 / start.elapsed_time(end)
