"""Log rotation of a running collector's files, as users do it (issue 46): Debian's
``logrotate`` with docs/operating.md's stanza (rename, then ``postrotate`` sends SIGHUP, as the
systemd unit's reload does), and a rename with no signal at all. The collector goes on, and
every step is in exactly one of the files: none lost, none written twice."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from rlpulse.collector.launch import start_collector
from rlpulse.producer import Producer
from rlpulse.producer.config import ProducerConfig
from tests.docs import doc_block
from tests.integration.collectors import SPAWN
from tests.integration.workload import LOSS, T_TOTAL
from tests.support.waiting import eventually

LOGROTATE = shutil.which("logrotate") or "/usr/sbin/logrotate"
STEPS = 300
RUN = "rotated"
DOC_JSONL = "/var/lib/rlpulse/runs/metrics.jsonl"
DOC_TRACES = "/var/lib/rlpulse/runs/traces/*.trace.json"
DOC_RELOAD = "systemctl reload rlpulse-collector"


def paced_rank(address: str, stats_path: str) -> None:
    """One rank: ``STEPS`` steps 10 ms apart, each with a phase time (a span for the trace)."""
    config = ProducerConfig(close_timeout_s=20.0)
    with Producer(address, run=RUN, role="actor_train", config=config) as p:
        for step in range(STEPS):
            p.log({LOSS: float(step), T_TOTAL: 0.005}, step=step)
            time.sleep(0.01)
    Path(stats_path).write_text(json.dumps(p.stats()))


def steps_in(path: Path) -> list[int]:
    """The steps of the jsonl lines in ``path`` (every line must be whole JSON)."""
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def trace_steps(path: Path) -> list[int]:
    """The step events of a trace file, which must be a whole JSON array."""
    events = json.loads(path.read_text())
    return [e["args"]["step"] for e in events if e.get("name", "").startswith("step ")]


def rotate_during_a_run(tmp_path: Path, rotate: Callable[[int, Path], None]) -> Path:
    """A collector (state_dir, jsonl, trace) receives ``STEPS`` steps from a producer
    process; once 100 are written, ``rotate(collector pid, out)`` runs. The collector must
    still be there afterwards and stop cleanly; returns where its stderr went."""
    out, traces, log = tmp_path / "metrics.jsonl", tmp_path / "traces", tmp_path / "collector.log"
    stats = tmp_path / "rank.json"
    config = {
        "track_with": ["jsonl", "trace"],
        "tracker_kwargs": {"jsonl": {"path": str(out)}, "trace": {"dir": str(traces)}},
        "state_dir": str(tmp_path / "state"),
        "settle_s": 0,
    }
    with log.open("w") as stderr:
        collector = start_collector(config, stderr=stderr, stdout=subprocess.DEVNULL)
    try:
        rank = SPAWN.Process(target=paced_rank, args=(collector.address, str(stats)))
        rank.start()
        eventually(lambda: out.exists() and len(out.read_text().splitlines()) >= 100, "100 steps")
        rotate(collector.proc.pid, out)
        rank.join(120)
        assert rank.exitcode == 0
        assert collector.proc.poll() is None, "the collector died: " + log.read_text()[-2000:]
        total = len(list(out.parent.glob("metrics.jsonl*")))
        eventually(
            lambda: sum(len(steps_in(p)) for p in out.parent.glob("metrics.jsonl*")) >= STEPS,
            f"{STEPS} steps written across {total} files",
        )
    finally:
        code = collector.stop()
    assert code == 0, log.read_text()[-2000:]
    sent = json.loads(stats.read_text())
    assert sent["unacked"] == 0 and sent["dropped_send"] == 0, sent
    return log


def test_logrotate_with_the_documented_stanza_loses_and_repeats_no_step(tmp_path: Path) -> None:
    stanza = doc_block(
        "docs/operating.md",
        "## A long-lived collector: rotating its files, forgetting ended runs",
        "conf",
    )
    assert DOC_JSONL in stanza and DOC_TRACES in stanza and DOC_RELOAD in stanza

    def logrotate(pid: int, out: Path) -> None:
        conf = tmp_path / "logrotate.conf"
        conf.write_text(
            stanza.replace(DOC_JSONL, str(out))
            .replace(DOC_TRACES, str(tmp_path / "traces" / "*.trace.json"))
            .replace(DOC_RELOAD, f"kill -HUP {pid}")  # what the unit's ExecReload sends
        )
        done = subprocess.run(
            [LOGROTATE, "--force", "--state", str(tmp_path / "logrotate.state"), str(conf)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert (tmp_path / "metrics.jsonl.1").exists()  # renamed (compressed next time)

    log = rotate_during_a_run(tmp_path, logrotate)
    old, new = steps_in(tmp_path / "metrics.jsonl.1"), steps_in(tmp_path / "metrics.jsonl")
    assert old and new, (len(old), len(new))
    assert old + new == list(range(STEPS))  # in order, each once
    (old_trace,) = tmp_path.glob("traces/*.trace.json.1")
    (new_trace,) = tmp_path.glob("traces/*.trace.json")
    spans_old, spans_new = trace_steps(old_trace), trace_steps(new_trace)
    assert spans_old and spans_new
    assert spans_old + spans_new == list(range(STEPS))
    assert "SIGHUP: the sinks reopen their files" in log.read_text()


def test_a_rename_without_a_signal_is_noticed_within_a_second(tmp_path: Path) -> None:
    def rename(pid: int, out: Path) -> None:
        os.rename(out, out.with_name("metrics.jsonl.old"))
        os.rename(
            next((tmp_path / "traces").glob("*.trace.json")),
            tmp_path / "traces" / "rotated.trace.json.old",
        )

    rotate_during_a_run(tmp_path, rename)
    old = steps_in(tmp_path / "metrics.jsonl.old")
    new = steps_in(tmp_path / "metrics.jsonl")
    assert old and new and old + new == list(range(STEPS))
    spans = trace_steps(tmp_path / "traces" / "rotated.trace.json.old")
    spans += trace_steps(next((tmp_path / "traces").glob("*.trace.json")))
    assert spans == list(range(STEPS))
