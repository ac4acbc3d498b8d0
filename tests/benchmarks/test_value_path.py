"""The value-path tracer sees the whole way of one value: the caller's ``log()``, the sender
thread, the collector's loop and the jsonl sink's write, and the value arrives."""

from __future__ import annotations

from benchmarks.value_path import trace_one_value


def test_value_path_follows_one_value_to_its_json_line() -> None:
    result = trace_one_value()
    assert result["record_has_value"]
    functions = [f for fs in result["order"].values() for f in fs]
    assert "producer.client.Producer.log" in functions
    assert any(f.startswith("wire.transport.") for f in functions)
    assert any(".jsonl." in f for f in functions), "the jsonl sink's write is on the path"
    threads = result["per_thread"]
    assert len(threads) >= 3 and all(n > 0 for n in threads.values()), threads
    assert result["functions"] == len(functions)
