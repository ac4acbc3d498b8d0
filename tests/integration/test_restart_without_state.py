"""A collector without ``state_dir`` killed mid-run and started again: what its producers say
when they reconnect (``Hello.went_out``) flags the records of the steps the first instance
may have written (``partial`` and ``continued``) and the ranks whose resent calls they hold
(``resent``), counted on /metrics and in the stop line. Before, the restarted collector wrote
a second record of a step it had written already, whole-looking and unflagged (its calls
resent, unacknowledged at the kill, and counted again): nothing showed it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

from rlpulse.collector.launch import start_collector
from tests.support.net import free_port
from tests.support.prom import scrape
from tests.support.waiting import eventually

WORKER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from rlpulse import Producer
    from rlpulse.producer.config import ProducerConfig

    rank, address, work = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    # heartbeat_s 5: the hello repeated every 25 s, so no hello's ack covers the burst below
    config = ProducerConfig(close_timeout_s=60, heartbeat_s=5)
    p = Producer(address, run="again", role="actor_train", rank=rank, world_size=2,
                 reductions={"my/calls": "sum"}, config=config)

    def call(step):
        p.log({"my/x": float(step), "my/calls": 1}, step=step)  # my/calls: calls merged

    for step in range(4):
        call(step); call(step)
        time.sleep(0.05)
    time.sleep(1.5)  # all of it acknowledged (within the collector's 0.5 s ack delay)
    call(4); call(4); call(5)  # step 4 whole and step 5 begun, in one burst
    (work / f"burst{rank}").touch()
    while not (work / "go").exists():
        time.sleep(0.01)
    call(5)
    for step in range(6, 9):
        call(step); call(step)
        time.sleep(0.05)
    p.close()  # waits for the restarted collector to acknowledge everything
    stats = p.stats()
    sys.exit(0 if stats["unacked"] == stats["dropped_send"] == stats["unconfirmed"] == 0 else 3)
    """
)
STEPS, CALLS = 9, 4  # two ranks, two calls each a step


def test_a_restart_without_state_dir_flags_and_counts_what_the_first_instance_may_have_written(
    tmp_path: Path,
) -> None:
    (tmp_path / "worker.py").write_text(WORKER)
    out, port = tmp_path / "out.jsonl", free_port()
    bind = f"tcp://127.0.0.1:{free_port()}"
    config = {
        "track_with": ["jsonl", "prometheus"],
        "tracker_kwargs": {"jsonl": {"path": str(out)}, "prometheus": {"port": port}},
        "settle_s": 0,
    }

    def lines() -> list[dict]:
        return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []

    first = start_collector(config, bind=bind, stderr=(tmp_path / "first.log").open("w"))
    workers = [
        subprocess.Popen([sys.executable, "worker.py", str(r), bind, str(tmp_path)], cwd=tmp_path)
        for r in range(2)
    ]
    second = None
    try:
        eventually(lambda: all((tmp_path / f"burst{r}").exists() for r in range(2)), "bursts")
        # Step 4 written once both ranks began step 5: the burst was applied; killed now, the
        # first instance has not acknowledged it (it acknowledges data up to 0.5 s late).
        eventually(lambda: any(r["step"] == 4 for r in lines()), "step 4", poll_s=0.002)
        first.kill()
        second_log = tmp_path / "second.log"
        second = start_collector(config, bind=bind, stderr=second_log.open("w"))
        (tmp_path / "go").touch()
        assert [w.wait(90) for w in workers] == [0, 0]  # nothing dropped by the producers
        eventually(lambda: any(r["step"] == STEPS - 1 for r in lines()), "the last step")
        metrics = scrape(port)
        assert second.stop() == 0
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
        first.stop()
        if second is not None:
            second.stop()

    records = lines()
    by_step = Counter(r["step"] for r in records)
    assert by_step[4] == 2, records  # written by both instances
    for record in records:  # what is not flagged is the exact step, and there is one of it
        if not record["partial"]:
            assert record["metrics"]["my/calls"] == CALLS, record
            assert record["metrics"]["my/x"] == record["step"], record
    unflagged = Counter(r["step"] for r in records if not r["partial"])
    assert max(unflagged.values()) == 1, records
    again = [r for r in records if r.get("continued")]
    assert [r["step"] for r in again] == [4, 5], records
    both = ["actor_train/0", "actor_train/1"]
    assert all(r["partial"] and r["resent"] == both for r in again), again
    assert sorted(r["step"] for r in records if r["step"] > 5) == [6, 7, 8]

    assert metrics["rlpulse_collector_continued_steps_total"] == 2
    assert metrics["rlpulse_collector_resent_entries_total"] == 6  # steps 4 and 5's first call
    stopped = second_log.read_text().splitlines()[-1]
    said = re.search(r"(\d+) steps continued from an earlier instance \((\d+) entries", stopped)
    assert said is not None and said.groups() == ("2", "6"), stopped
    assert "continued: an earlier collector instance" in second_log.read_text()  # its warning
