"""With CurveZMQ on, only allow-listed workers get in; the others are refused and counted."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

from rlpulse.collector.launch import start_collector
from rlpulse.producer import Producer
from rlpulse.wire.transport import load_curve


def keygen(directory: Path, name: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "rlpulse.collector", "keygen", str(directory), name],
        check=True,
        capture_output=True,
    )


def test_allow_listed_key_gets_in_unknown_key_and_plaintext_do_not(tmp_path) -> None:
    keygen(tmp_path / "server", "collector")
    keygen(tmp_path / "allowed", "worker")
    keygen(tmp_path / "stranger", "intruder")
    assert oct((tmp_path / "allowed" / "worker.key_secret").stat().st_mode & 0o777) == "0o600"
    out = tmp_path / "out.jsonl"
    log = tmp_path / "collector.log"
    config = {
        "track_with": ["jsonl"],
        "tracker_kwargs": {"jsonl": {"path": str(out)}},
        "curve": {
            "server_cert": str(tmp_path / "server" / "collector.key_secret"),
            "clients_dir": str(tmp_path / "allowed"),
        },
    }
    collector = start_collector(config, stderr=log.open("w"))
    server_key = str(tmp_path / "server" / "collector.key")
    producers = {
        "good": Producer(
            collector.address,
            run="good",
            role="a",
            curve=load_curve(server_key, str(tmp_path / "allowed" / "worker.key_secret")),
        ),
        "stranger": Producer(
            collector.address,
            run="stranger",
            role="a",
            curve=load_curve(server_key, str(tmp_path / "stranger" / "intruder.key_secret")),
        ),
        "plaintext": Producer(collector.address, run="plaintext", role="a"),
    }
    for step in range(3):
        for p in producers.values():
            p.log({"x": float(step)}, step=step)
    assert producers["good"].flush(10)
    time.sleep(1.0)
    for p in producers.values():
        p.close(timeout=1.0)
    assert collector.stop() == 0
    runs = {json.loads(line)["run"] for line in out.read_text().splitlines()}
    assert runs == {"good"}
    assert (
        producers["stranger"].stats()["unacked"] > 0
        or producers["stranger"].stats()["dropped_send"] > 0
    )
    text = log.read_text()
    assert "CurveZMQ on" in text and "refused a client" in text
    assert int(re.search(r"(\d+) handshake failures", text).group(1)) >= 2
