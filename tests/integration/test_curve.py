"""With CurveZMQ on, only allow-listed workers get in; the others are refused and counted."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import time
from pathlib import Path

from rlpulse.collector.launch import start_collector
from rlpulse.collector.tiers.upstream import REFUSED_RETRY_S
from rlpulse.producer import Producer
from rlpulse.wire.transport import load_curve
from tests.integration.collectors import wait_for_steps
from tests.support.net import free_port


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


def test_a_refused_producer_says_a_collector_answered_and_refused_it_and_why(
    tmp_path, caplog
) -> None:
    """Issue 45, item 5: a plaintext producer, or one whose key the collector does not list,
    said only "not connected"; the handshake's failure was in the collector's log alone. Its
    own warning now says that a collector answered but refused it, and why (ZeroMQ's handshake
    events tell a mechanism mismatch, a ZAP refusal and a failed key exchange apart from
    silence); close() then neither waits for a connection that will not come nor blames it."""
    caplog.set_level(logging.WARNING, "rlpulse.producer")
    keygen(tmp_path / "server", "collector")
    keygen(tmp_path / "other-server", "collector")
    keygen(tmp_path / "allowed", "worker")
    keygen(tmp_path / "stranger", "intruder")
    config = {
        "track_with": ["jsonl"],
        "tracker_kwargs": {"jsonl": {"path": str(tmp_path / "out.jsonl")}},
        "curve": {
            "server_cert": str(tmp_path / "server" / "collector.key_secret"),
            "clients_dir": str(tmp_path / "allowed"),
        },
    }
    collector = start_collector(config, stderr=(tmp_path / "collector.log").open("w"))
    server_key = str(tmp_path / "server" / "collector.key")
    wrong_server_key = str(tmp_path / "other-server" / "collector.key")
    worker = str(tmp_path / "allowed" / "worker.key_secret")
    cases = {
        "plaintext": (None, "it requires CurveZMQ and this producer has no keys"),
        "stranger": (
            load_curve(server_key, str(tmp_path / "stranger" / "intruder.key_secret")),
            "its authentication refused this producer's public key (ZAP status 400)",
        ),
        "wrong-server-key": (
            load_curve(wrong_server_key, worker),
            "the CurveZMQ handshake failed with no detail, again and again",
        ),
    }
    try:
        producers = {
            run: Producer(collector.address, run=run, role="a", curve=curve)
            for run, (curve, _) in cases.items()
        }
        for p in producers.values():
            p.log({"x": 1.0}, step=0)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not all(
            f"run {run!r}" in caplog.text and why in caplog.text for run, (_, why) in cases.items()
        ):
            time.sleep(0.05)
        for p in producers.values():
            started = time.monotonic()
            p.close(timeout=10.0)
            assert time.monotonic() - started < 3.0  # no wait for a connection refused for good
            assert p.stats()["dropped_send"] == 1
    finally:
        assert collector.stop() == 0
    for run, (_, why) in cases.items():
        refused = [
            r.getMessage()
            for r in caplog.records
            if "answered but refused this producer" in r.getMessage()
            and f"run {run!r}" in r.getMessage()
        ]
        assert len(refused) == 1 and why in refused[0], (run, caplog.text)
        assert collector.address in refused[0]
    assert "no collector has answered" not in caplog.text  # it did answer: no second story
    closing = [r.getMessage() for r in caplog.records if "closed after" in r.getMessage()]
    assert len(closing) == 3 and all("refused this producer" in m for m in closing), closing


def test_a_relay_the_root_refuses_says_so_once_with_why_counts_it_and_gets_in_once_let(
    tmp_path,
) -> None:
    """A relay without keys under a root with Curve said nothing of it: its upstream link
    ignored the refusal and waited out its 5 s timeout again and again ("did not answer"),
    and nothing counted it. It now warns once, naming the root and why (and where a relay's
    keys go); a refused write fails at once instead of waiting out the timeout; its stop line
    and ``stopped.json`` count the refused handshakes; and since ZeroMQ gives such a
    connection up, it makes a new one now and then: the root restarted without Curve gets
    every step the relay kept meanwhile, without a restart of the relay."""
    keygen(tmp_path / "server", "collector")
    keygen(tmp_path / "allowed", "worker")
    out = tmp_path / "root.jsonl"
    bind = f"tcp://127.0.0.1:{free_port()}"
    root_config = {
        "track_with": ["jsonl"],
        "tracker_kwargs": {"jsonl": {"path": str(out)}},
        "settle_s": 0,
        "curve": {
            "server_cert": str(tmp_path / "server" / "collector.key_secret"),
            "clients_dir": str(tmp_path / "allowed"),
        },
    }
    root_log = tmp_path / "root.log"
    top = start_collector(root_config, bind=bind, stderr=root_log.open("w"))
    relay_log = tmp_path / "relay.log"
    relay_config = {"upstream": bind, "state_dir": str(tmp_path / "relay-state"), "settle_s": 0}
    below = start_collector(relay_config, stderr=relay_log.open("w"))
    refused_here = "answered but refused this relay"
    try:
        p = Producer(below.address, run="refused", role="a")
        for step in range(3):
            p.log({"x": float(step)}, step=step)
        p.close(timeout=10.0)
        assert p.stats()["dropped_send"] == p.stats()["unconfirmed"] == 0  # the relay has it
        deadline = time.monotonic() + 20
        while refused_here not in relay_log.read_text():
            assert time.monotonic() < deadline, relay_log.read_text()
            time.sleep(0.1)
        time.sleep(REFUSED_RETRY_S + 1.0)  # refused writes fail at once: no timeout waited out
        text = relay_log.read_text()
        assert "did not answer" not in text, text
        warned = [line for line in text.splitlines() if refused_here in line]
        assert len(warned) == 1, warned
        assert bind in warned[0] and "it requires CurveZMQ and this relay has no" in warned[0]
        assert "upstream_curve" in warned[0], warned[0]  # a relay's keys, named as it sets them
        assert out.read_text() == ""  # nothing got through
        # The root restarted without Curve: the relay, still running, gets in by itself.
        assert top.stop() == 0
        plain = {k: v for k, v in root_config.items() if k != "curve"}
        top = start_collector(plain, bind=bind, stderr=root_log.open("a"))
        wait_for_steps(out, "refused", 3, timeout_s=60)
    finally:
        assert below.stop() == 0
        top.stop()
    assert [json.loads(line)["step"] for line in out.read_text().splitlines()] == [0, 1, 2]
    text = relay_log.read_text()
    assert "lets this relay in" in text and len(re.findall(refused_here, text)) == 1
    stopped = text.splitlines()[-1]
    refused = re.search(r"the collector above refused (\d+) handshakes of this relay", stopped)
    assert refused is not None and int(refused.group(1)) >= 1, stopped
    report = json.loads((tmp_path / "relay-state" / "stopped.json").read_text())
    assert report["upstream_refused"] == int(refused.group(1))
