"""Nothing lost, nothing duplicated: collector crashes, collector downtime, sink outages."""

from __future__ import annotations

import json
import random
import subprocess
import threading
import time
from pathlib import Path

import pytest

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.daemon import Collector
from rlpulse.collector.launch import start_collector
from rlpulse.collector.sinks.base import Sink
from rlpulse.producer import Producer
from rlpulse.schemas.record import StepRecord
from tests.integration.collectors import SPAWN, assert_matches, read_jsonl
from tests.integration.workload import expected, run_rank
from tests.support.net import free_port


def durable_config(tmp_path: Path, **extra) -> dict:
    return {
        "track_with": ["jsonl"],
        "tracker_kwargs": {"jsonl": {"path": str(tmp_path / "out.jsonl")}},
        "state_dir": str(tmp_path / "state"),
        "grace_s": 120,
        "liveness_s": 60,
        "checkpoint_s": 0.5,
        "segment_bytes": 256 * 1024,
        # Producer processes start seconds apart on a loaded 2-core machine; let the first
        # run far ahead rather than have the open-step bound flag its steps partial.
        "max_open_steps": 1000,
        "settle_s": 0,
        **extra,
    }


def launch(config: dict, bind: str, log: Path):
    return start_collector(config, bind=bind, stderr=log.open("a"), stdout=subprocess.DEVNULL)


def test_collector_killed_repeatedly_loses_and_duplicates_nothing(tmp_path) -> None:
    bind = f"tcp://127.0.0.1:{free_port()}"
    config = durable_config(tmp_path)
    log = tmp_path / "collector.log"
    collector = launch(config, bind, log)
    layout = [("actor_train", r, 4) for r in range(4)]
    steps = 300
    procs = [
        SPAWN.Process(
            target=run_rank,
            args=(bind, "crash", role, rank, ws, steps),
            kwargs={"pause": 0.01, "close_timeout_s": 60},
        )
        for role, rank, ws in layout
    ]
    for proc in procs:
        proc.start()
    rng = random.Random(11)
    kills = 0
    while any(p.is_alive() for p in procs) and kills < 3:
        time.sleep(rng.uniform(0.5, 1.5))
        collector.proc.kill()  # SIGKILL: no chance to flush anything
        collector.proc.wait()
        kills += 1
        time.sleep(rng.uniform(0.1, 0.8))
        collector = launch(config, bind, log)
    for proc in procs:
        proc.join(180)
        assert proc.exitcode == 0
    assert collector.stop() == 0
    records = read_jsonl(Path(config["tracker_kwargs"]["jsonl"]["path"]))
    assert kills == 3
    assert [r["step"] for r in records] == list(range(steps))  # every step, once, in order
    ranks = [(role, rank) for role, rank, _ in layout]
    for record in records:
        assert not record["partial"], record["step"]
        assert_matches(record, expected(ranks, record["step"]))
    assert "recovered from" in log.read_text()
    # compaction kept the state bounded: far less than the run's data
    state = Path(config["state_dir"])
    assert sum(f.stat().st_size for f in state.rglob("*.log")) < 2 * 1024 * 1024


def test_collector_down_midrun_buffers_then_delivers_and_counts_drops_beyond_the_bound(
    tmp_path,
) -> None:
    bind = f"tcp://127.0.0.1:{free_port()}"
    config = durable_config(tmp_path)
    log = tmp_path / "collector.log"
    collector = launch(config, bind, log)
    steps = 150
    stats = [tmp_path / f"stats{r}.json" for r in range(2)]
    out = Path(config["tracker_kwargs"]["jsonl"]["path"])
    procs = [
        SPAWN.Process(
            target=run_rank,
            args=(bind, "down", "actor_train", r, 2, steps),
            kwargs={
                "pause": 0.03,
                "close_timeout_s": 60,
                "stats_path": str(stats[r]),
                "max_unacked": 10_000 if r == 0 else 15,
            },
        )
        for r in range(2)
    ]
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + 60
    while (not out.exists() or len(read_jsonl(out)) < 5) and time.monotonic() < deadline:
        time.sleep(0.05)  # both ranks are connected and streaming
    assert collector.stop() == 0  # down for a while mid-run
    time.sleep(2.0)
    collector = launch(config, bind, log)
    for proc in procs:
        proc.join(120)
        assert proc.exitcode == 0
    assert collector.stop() == 0
    s0, s1 = (json.loads(p.read_text()) for p in stats)
    # log() never waited on the missing collector
    assert s0["worst_log_s"] < 0.5 and s1["worst_log_s"] < 0.5
    # rank 0's buffer held everything; rank 1's small buffer overflowed and counted it
    assert s0["dropped_buffer_full"] == 0 and s0["unacked"] == 0
    assert s1["dropped_buffer_full"] > 0
    records = read_jsonl(out)
    assert [r["step"] for r in records] == list(range(steps))
    both_ranks, rank0_only = 0, 0
    for record in records:
        both = expected([("actor_train", 0), ("actor_train", 1)], record["step"])
        alone = expected([("actor_train", 0)], record["step"])
        # each log() call of rank 1 either arrived whole or was dropped (and counted) whole
        for group in (["critic/advantages/mean", "actor/pg_loss"], ["actor/clipfrac"]):
            got = [record["metrics"][name] for name in group]
            if got == pytest.approx([both[n] for n in group], rel=1e-9):
                both_ranks += 1
            else:
                assert got == pytest.approx([alone[n] for n in group], rel=1e-9), record["step"]
                rank0_only += 1
    assert both_ranks > 0 and rank0_only > 0
    assert rank0_only <= s1["dropped_buffer_full"]
    summary = log.read_text().splitlines()[-1]
    assert f"producers dropped {s1['dropped_buffer_full']}" in summary


class FlakySink(Sink):
    """Fails every write while ``down`` is set; records what it wrote."""

    name = "flaky"

    def __init__(self) -> None:
        self.down = threading.Event()
        self.written: list[int] = []

    def open(self) -> None:
        pass

    def write(self, record: StepRecord) -> None:
        if self.down.is_set():
            raise ConnectionError("tracker backend unavailable")
        self.written.append(record.step)

    def close(self) -> None:
        pass


def test_a_failing_sink_catches_up_in_order_once_it_recovers(tmp_path) -> None:
    from rlpulse.collector.sinks.jsonl import JsonlSink

    flaky = FlakySink()
    jsonl = JsonlSink(tmp_path / "out.jsonl")
    config = CollectorConfig.from_mapping(
        {
            "bind": "tcp://127.0.0.1:*",
            "state_dir": str(tmp_path / "state"),
            "sink_retries": 2,
            "settle_s": 0,
        }
    )
    collector = Collector(config, sinks={"flaky": flaky, "jsonl": jsonl})
    server = threading.Thread(
        target=collector.run, daemon=True
    )  # a failed assert must not hang pytest
    server.start()
    p = Producer(collector.address, run="outage", role="actor_train")
    flaky.down.set()
    for step in range(60):
        p.log({"x": float(step)}, step=step)
        if step == 40:
            p.flush(5)
            time.sleep(0.5)
            lagging = collector.health.snapshot()["sinks"]["flaky"]
            assert (
                lagging["queue_depth"] >= 39
                and lagging["lag_seconds"] > 0.3
                and lagging["errors"] > 0
            )
            assert len(read_jsonl(tmp_path / "out.jsonl")) >= 39  # the healthy sink stayed current
            flaky.down.clear()
        time.sleep(0.01)
    p.close()
    deadline = time.monotonic() + 10
    while len(flaky.written) < 60 and time.monotonic() < deadline:
        time.sleep(0.05)
    collector.stop()
    server.join(30)
    assert flaky.written == list(range(60))


@pytest.mark.parametrize("torn", [b'{"run":"x","st', b""])
def test_jsonl_sink_repairs_a_torn_line_and_knows_what_it_wrote(tmp_path, torn: bytes) -> None:
    from rlpulse.collector.sinks.jsonl import JsonlSink

    path = tmp_path / "o.jsonl"
    sink = JsonlSink(path)
    sink.open()
    for step in range(3):
        sink.write(StepRecord(run="a", step=step, metrics={}))
    sink.close()
    with path.open("ab") as f:
        f.write(torn)
    again = JsonlSink(path)
    again.open()
    assert again.written_through() == {"a": 2}
    again.write(StepRecord(run="a", step=3, metrics={}))
    again.close()
    assert [r["step"] for r in read_jsonl(path)] == [0, 1, 2, 3]


def test_tensorboard_sink_knows_what_it_wrote_across_restarts(tmp_path) -> None:
    from rlpulse.collector.sinks.base import SinkContext
    from rlpulse.collector.sinks.tensorboard import TensorBoardSink

    sink = TensorBoardSink.from_kwargs({"log_dir": str(tmp_path)}, SinkContext())
    sink.open()
    for step in range(4):
        sink.write(StepRecord(run="ppo", step=step, metrics={"x": 1.0}))
    sink.close()
    again = TensorBoardSink.from_kwargs({"log_dir": str(tmp_path)}, SinkContext())
    assert again.written_through() == {"ppo": 3}
