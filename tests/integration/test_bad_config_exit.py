"""``python -m rlpulse.collector --config BAD.yaml`` as a user runs it: every bad configuration of
issue 17 (item 3) exits with status 2 and one line naming the field and the problem, never a
traceback and never a collector that starts anyway. Ports in use are real sockets."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
import zmq


def run_collector(tmp_path: Path, config: dict) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "collector.yaml"
    path.write_text(yaml.safe_dump(config))
    return subprocess.run(
        [sys.executable, "-m", "rlpulse.collector", "--config", str(path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,  # a collector that starts anyway runs until killed: the test fails
        check=False,
    )


def assert_refused(done: subprocess.CompletedProcess[str], field: str, problem: str) -> None:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "listening on" not in done.stderr, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(f"rlpulse-collector: configuration error: {field}: "), line
    assert problem in line, line


@pytest.fixture
def busy_tcp_port() -> Iterator[int]:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


@pytest.mark.parametrize(
    "config, field, problem",
    [
        ({"log_level": 3}, "log_level", "must be one of DEBUG, INFO, WARNING, ERROR"),
        ({"bind": "tcp://127.0.0.1:99999"}, "bind", "port must be from 0 to 65535"),
        ({"bind": "tcp://127.0.0.1:-5"}, "bind", "port must be from 0 to 65535"),
        ({"sink_retries": True}, "sink_retries", "must be a non-negative integer"),
        ({"track_with": []}, "track_with", "would discard every step"),
    ],
    ids=["log_level", "port-too-big", "port-negative", "sink_retries", "no-tracker"],
)
def test_bad_value(tmp_path: Path, config: dict, field: str, problem: str) -> None:
    assert_refused(run_collector(tmp_path, config), field, problem)


def test_state_dir_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "state").write_text("not a directory")
    done = run_collector(tmp_path, {"state_dir": str(tmp_path / "state")})
    assert_refused(done, "state_dir", "is a file, not a directory")


def test_swapped_tls_files(tmp_path: Path, tls_pair: tuple[Path, Path]) -> None:
    cert, key = tls_pair
    config = {
        "bind": "tcp://127.0.0.1:*",
        "track_with": ["prometheus"],
        "tracker_kwargs": {"prometheus": {"port": 0, "certfile": str(key), "keyfile": str(cert)}},
    }
    done = run_collector(tmp_path, config)
    assert_refused(done, "tracker_kwargs.prometheus.certfile", "certfile and keyfile are swapped")


def test_zeromq_port_in_use(tmp_path: Path) -> None:
    ctx = zmq.Context()
    taken = ctx.socket(zmq.ROUTER)
    try:
        port = taken.bind_to_random_port("tcp://127.0.0.1")
        done = run_collector(tmp_path, {"bind": f"tcp://127.0.0.1:{port}"})
    finally:
        taken.close(linger=0)
        ctx.term()
    assert_refused(done, "bind", "cannot listen there: Address already in use")


def test_prometheus_port_in_use(tmp_path: Path, busy_tcp_port: int) -> None:
    config = {
        "bind": "tcp://127.0.0.1:*",
        "track_with": ["prometheus"],
        "tracker_kwargs": {"prometheus": {"port": busy_tcp_port}},
    }
    done = run_collector(tmp_path, config)
    assert_refused(done, "tracker_kwargs.prometheus.port", "already in use")
