"""Names beyond the collector's ``max_names_per_run`` are dropped there and counted there, and
now told to the producer, whose ``stats()`` counts them (issue 38, item 5: it showed nothing)."""

from __future__ import annotations

import json
import subprocess

from rlpulse.collector.launch import start_collector
from rlpulse.producer import Producer
from tests.support.net import free_port


def test_names_over_the_run_bound_show_in_the_producers_stats(tmp_path, caplog) -> None:
    out = tmp_path / "out.jsonl"
    config = {
        "track_with": ["jsonl"],
        "tracker_kwargs": {"jsonl": {"path": str(out)}},
        "max_names_per_run": 5,
    }
    bind = f"tcp://127.0.0.1:{free_port()}"
    collector = start_collector(config, bind=bind, stdout=subprocess.DEVNULL)
    try:
        p = Producer(bind, run="names", role="actor_train")
        for step in range(3):
            p.log({f"many/n{i}": float(i) for i in range(8)}, step=step)
        assert p.flush(10)
        p.log({"many/n0": 1.0}, step=3)  # a later ack carries the count to the producer
        assert p.flush(10)
        stats = p.stats()
        p.close()
    finally:
        assert collector.stop() == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [len(r["metrics"]) >= 5 for r in records[:3]] == [True] * 3
    assert stats["dropped_names"] == 3 * 3, stats  # 3 names too many, in 3 entries
    told = [r.getMessage() for r in caplog.records if "dropped_names" in r.getMessage()]
    assert told and "max_names_per_run" in told[0] and "malformed" not in told[0], told
