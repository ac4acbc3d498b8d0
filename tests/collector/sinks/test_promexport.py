"""The collector's own process metrics on /metrics: read from /proc at most once a second."""

from __future__ import annotations

import pytest

pytest.importorskip("prometheus_client")

from rlpulse.collector.sinks import promexport
from rlpulse.collector.sinks.promexport import ProcessSnapshot


def test_process_metrics_are_reread_only_after_the_refresh_interval(monkeypatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(promexport.time, "monotonic", lambda: clock[0])
    snapshot = ProcessSnapshot()
    reads = []
    inner = snapshot._inner.collect
    monkeypatch.setattr(snapshot._inner, "collect", lambda: reads.append(1) or inner())
    first = snapshot.collect()
    assert {f.name for f in first} >= {"process_resident_memory_bytes", "process_cpu_seconds"}
    clock[0] += promexport.PROCESS_REFRESH_S / 2
    assert snapshot.collect() is first and len(reads) == 1
    clock[0] += promexport.PROCESS_REFRESH_S
    assert snapshot.collect() is not first and len(reads) == 2
