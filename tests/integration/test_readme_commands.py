"""The README's "Exposing the collector safely" section, run as a user runs it: its keygen
commands, its YAML, its environment variables, workers started together. Every step must be
whole (issue 17: with only public keys in ``clients_dir`` nothing was applied)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
RANKS, STEPS = 4, 5


def readme_section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 3)
    return text[start : end if end > 0 else None]


def blocks(section: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", section, flags=re.S)


WORKER = textwrap.dedent(
    """
    import sys
    from rlpulse.producer import Producer, Weighted
    from rlpulse.schemas import metrics as M

    rank = int(sys.argv[1])
    p = Producer(run="curve", role="actor_train", rank=rank, world_size=int(sys.argv[2]))
    for step in range(int(sys.argv[3])):
        p.log({M.ACTOR_PG_LOSS.name: Weighted(float(rank), 10)}, step=step)
    p.close()
    sys.exit(0 if p.stats()["unacked"] == 0 and p.stats()["dropped_send"] == 0 else 3)
    """
)


def test_curve_exactly_as_the_readme_lays_out_the_keys(tmp_path) -> None:
    section = readme_section("Exposing the collector safely")
    (commands,) = blocks(section, "bash")
    (config_text,) = blocks(section, "yaml")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for line in commands.splitlines():
        command = line.split("#")[0].strip()
        if command:
            command = re.sub(r"^python ", f"{sys.executable} ", command)
            command = re.sub(r"^rlpulse ", f"{Path(sys.executable).parent / 'rlpulse'} ", command)
            subprocess.run(command, shell=True, cwd=tmp_path, env=env, check=True)
    assert sorted(p.name for p in (tmp_path / "keys" / "clients").iterdir()) == ["worker.key"]

    out = tmp_path / "out.jsonl"
    config = yaml.safe_load(config_text)
    config.update(track_with=["jsonl"], tracker_kwargs={"jsonl": {"path": str(out)}})
    (tmp_path / "collector.yaml").write_text(yaml.safe_dump(config))
    log = tmp_path / "collector.log"
    ready = tmp_path / "ready"
    # The README binds 0.0.0.0:5555; tests bind loopback on a free port (--bind, as documented).
    command = [sys.executable, "-m", "rlpulse.collector", "--config", "collector.yaml"]
    collector = subprocess.Popen(
        [*command, "--bind", "tcp://127.0.0.1:*", "--ready-file", str(ready)],
        cwd=tmp_path,
        env=env,
        stderr=log.open("w"),
    )
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert collector.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.02)
    address = ready.read_text().strip()

    worker_env = dict(env)
    for name, value in re.findall(r"`(RLPULSE_[A-Z_]+)=([^`]+)`", section):
        worker_env[name] = value
    worker_env["RLPULSE_ADDRESS"] = address  # the README's collector-host, here
    assert {"RLPULSE_CURVE_SERVER_KEY", "RLPULSE_CURVE_CLIENT_CERT"} <= set(worker_env)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    try:
        workers = [
            subprocess.Popen(
                [sys.executable, str(script), str(r), str(RANKS), str(STEPS)],
                cwd=tmp_path,
                env=worker_env,
            )
            for r in range(RANKS)
        ]
        assert [w.wait(60) for w in workers] == [0] * RANKS
    finally:
        collector.terminate()
        assert collector.wait(30) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(STEPS))
    assert all(not r["partial"] and r["ranks"] == RANKS for r in records), records
    text = log.read_text()
    assert "CurveZMQ on" in text and "secret keys" not in text
    assert "0 handshake failures" in text


def test_collector_warns_about_secret_keys_in_clients_dir(tmp_path) -> None:
    """The old README layout (keygen straight into clients_dir) still works, but the collector
    says that the secret key does not belong there."""
    import logging

    from rlpulse.collector.config import CollectorConfig
    from rlpulse.collector.daemon import Collector

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for directory, name in (("server", "collector"), ("clients", "worker")):
        subprocess.run(
            [sys.executable, "-m", "rlpulse.collector", "keygen", str(tmp_path / directory), name],
            env=env,
            check=True,
            capture_output=True,
        )
    config = CollectorConfig(
        bind="tcp://127.0.0.1:*",
        curve={
            "server_cert": str(tmp_path / "server" / "collector.key_secret"),
            "clients_dir": str(tmp_path / "clients"),
        },
    )
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("rlpulse.collector")
    logger.addHandler(handler)
    try:
        Collector(config, sinks={}).close()
    finally:
        logger.removeHandler(handler)
    assert any("worker.key_secret" in r.getMessage() for r in records)
