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


def test_text_is_rendered_again_only_when_a_part_key_changes() -> None:
    rendered: list[list[str]] = []

    def encoder(collector) -> bytes:
        names = [f.name for f in collector.collect()]
        rendered.append(names)
        return "".join(f"{n}\n" for n in names).encode() + b"END\n"

    cache = promexport.TextCache()
    a = [promexport.make_family("a", "A.", "gauge", [], [([], 1.0)])]
    b = [promexport.make_family("b", "B.", "gauge", [], [([], 2.0)])]
    assert cache.join(encoder, "t", [("x", 1, a), ("y", 1, b)]) == b"a\nb\nEND\n"
    assert rendered == [[], ["a"], ["b"]]  # the trailer once, then each part
    assert cache.join(encoder, "t", [("x", 1, a), ("y", 2, a)]) == b"a\na\nEND\n"
    assert rendered[3:] == [["a"]]  # only the part whose key changed
    assert cache.join(encoder, "u", [("x", 1, a)]) == b"a\nEND\n"  # another format, its own text
    assert len(rendered) == 6


def test_text_cache_keeps_a_bounded_number_of_formats() -> None:
    cache = promexport.TextCache()
    family = [promexport.make_family("a", "A.", "gauge", [], [([], 1.0)])]
    for i in range(3 * cache.MAX_FORMATS):
        cache.join(lambda c: b"", f"text/plain; version={i}", [("x", 1, family)])
    assert len(cache._formats) == cache.MAX_FORMATS
