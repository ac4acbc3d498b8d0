"""A full disk, for real: a small tmpfs mounted for the test (root only; skipped elsewhere)
under ``state_dir`` or under a jsonl sink's file (issue 22, items 9 and 10)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from rlpulse.producer import Producer
from rlpulse.producer.config import ProducerConfig
from tests.integration.collectors import Setup
from tests.support.disk import fill, small_disk
from tests.support.net import free_port
from tests.support.prom import scrape
from tests.support.waiting import eventually

NAMES = [f"disk/value_{i:02d}" for i in range(40)]
"""Enough names that a few steps fill more than the last page of a file."""


def writable(port: int) -> float | None:
    """``rlpulse_collector_state_writable`` now; None when it cannot be read (a collector
    that died, or one without the gauge)."""
    try:
        return scrape(port).get("rlpulse_collector_state_writable")
    except OSError:
        return None


def log_steps(p: Producer, steps: range) -> None:
    for step in steps:
        p.log({name: float(step) for name in NAMES}, step=step)


def assert_each_step_once(path: Path, steps: int) -> None:
    lines = [json.loads(line) for line in path.read_text().splitlines()]  # every line whole
    assert [r["step"] for r in lines] == list(range(steps))
    for r in lines:
        assert not r["partial"] and r["metrics"][NAMES[0]] == r["step"], r["step"]


# ---------------------------------------------------------------------- item 9


def test_a_full_state_disk_stops_acknowledging_and_resumes_when_space_returns(tmp_path) -> None:
    with small_disk(tmp_path / "disk") as disk:
        port = free_port()
        setup = Setup(
            tmp_path,
            track_with=["jsonl", "prometheus"],
            tracker_kwargs={
                "jsonl": {"path": str(tmp_path / "out.jsonl")},
                "prometheus": {"port": port},
            },
            segment_bytes=64 * 1024,
        )
        setup.state = disk / "state"
        config = setup.config_path.read_text().replace(str(tmp_path / "state"), str(setup.state))
        setup.config_path.write_text(config)
        collector = setup.started()
        at_start = scrape(port)
        p = Producer(
            setup.bind, run="full", role="actor_train", config=ProducerConfig(close_timeout_s=30)
        )
        log_steps(p, range(10))
        assert p.flush(30)

        filler = fill(disk)
        log_steps(p, range(10, 30))
        eventually(
            lambda: collector.proc.poll() is not None or writable(port) == 0,
            "the collector to say its state is unwritable",
            30,
        )
        assert collector.proc.poll() is None, collector.log.read_text()  # it did not crash
        assert scrape(port)["rlpulse_collector_disk_errors_total"] > 0
        assert not p.flush(2)  # nothing acknowledged that the log does not hold
        assert p.stats()["unacked"] > 0

        filler.unlink()  # space returns: the collector resumes by itself
        assert p.flush(60)
        eventually(lambda: writable(port) == 1, "the state to be writable again", 30)

        # Full again, and stopped while full: a clean exit, no traceback, nothing acked lost.
        filler = fill(disk)
        log_steps(p, range(30, 45))
        eventually(lambda: writable(port) == 0, "the state to be unwritable again", 30)
        assert collector.stop() == 0
        first_log = collector.log.read_text()
        filler.unlink()
        collector = setup.started()
        log_steps(p, range(45, 50))
        p.close()
        setup.wait_lines(50)  # the goodbye completes the last step
        assert collector.stop() == 0

    assert_each_step_once(tmp_path / "out.jsonl", 50)
    # on /metrics from start-up, before anything failed
    assert at_start["rlpulse_collector_state_writable"] == 1
    assert at_start["rlpulse_collector_disk_errors_total"] == 0
    assert at_start["rlpulse_sink_lost_total{sink=jsonl}"] == 0
    assert "Traceback" not in first_log, first_log
    errors = [line for line in first_log.splitlines() if "cannot write the state" in line]
    assert len(errors) == 2, errors  # once per episode, not once per retry
    assert "can be written again" in first_log


# ---------------------------------------------------------------------- item 10


def test_a_jsonl_sink_on_a_full_disk_writes_each_step_once_when_space_returns(tmp_path) -> None:
    with small_disk(tmp_path / "disk") as disk:
        out = disk / "out.jsonl"
        setup = Setup(tmp_path, tracker_kwargs={"jsonl": {"path": str(out)}})
        setup.out = out
        collector = setup.started()
        p = Producer(setup.bind, run="full", role="actor_train")
        log_steps(p, range(5))
        setup.wait_lines(4)

        filler = fill(disk)
        log_steps(p, range(5, 40))
        assert p.flush(30)  # the state is elsewhere: acknowledged, kept in the outbox
        time.sleep(2.0)  # the sink fails and retries meanwhile
        filler.unlink()
        p.close()
        setup.wait_lines(40)
        time.sleep(0.5)
        assert collector.stop() == 0
        assert_each_step_once(out, 40)
