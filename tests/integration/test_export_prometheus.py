"""``rlpulse deploy export``'s Prometheus config, run with the real ``prometheus`` binary as a
user without Docker runs it: ``prometheus --config.file=DIR/prometheus/prometheus.yml``. Its
target must be up (it named the compose service ``collector``, which resolves only inside the
compose network, so the plain server's target stayed down)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from rlpulse.collector.launch import start_collector
from rlpulse.deploy.export import DEFAULT_TARGET, main
from tests.integration.promserver import PROMETHEUS, PROMTOOL, free_port, get, need, targets, wait


def scrape_targets(config: Path) -> list[str]:
    jobs = yaml.safe_load(config.read_text())["scrape_configs"]
    static = [t for job in jobs for c in job.get("static_configs", []) for t in c["targets"]]
    sd = [c["url"] for job in jobs for c in job.get("http_sd_configs", [])]
    return static + sd


def test_the_default_target_is_where_the_exported_collector_serves(tmp_path: Path) -> None:
    assert main(["export", str(tmp_path)]) == 0
    config = tmp_path / "prometheus" / "prometheus.yml"
    assert scrape_targets(config) == [DEFAULT_TARGET, f"http://{DEFAULT_TARGET}/sd"]
    collector = yaml.safe_load((tmp_path / "collector.yaml").read_text())
    prom = collector["tracker_kwargs"]["prometheus"]
    assert f"{prom['host']}:{prom['port']}" == DEFAULT_TARGET
    need(PROMTOOL)
    done = subprocess.run(
        [PROMTOOL, "check", "config", str(config)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_bad_target_is_refused(tmp_path: Path, capsys) -> None:
    try:
        main(["export", str(tmp_path), "--target", "collector"])
    except SystemExit as exc:
        assert exc.code == 2
    assert "expected HOST:PORT" in capsys.readouterr().err
    assert not (tmp_path / "prometheus").exists()


def test_plain_prometheus_on_the_exported_config_scrapes_the_collector(tmp_path: Path) -> None:
    need(PROMETHEUS)
    port = free_port()
    target = f"127.0.0.1:{port}"
    out = tmp_path / "monitoring"
    done = subprocess.run(
        [sys.executable, "-m", "rlpulse", "deploy", "export", str(out), "--target", target],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    config = {
        "track_with": ["prometheus"],
        "tracker_kwargs": {"prometheus": {"host": "127.0.0.1", "port": port}},
    }
    collector = start_collector(config, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    web = f"127.0.0.1:{free_port()}"
    prom = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={out / 'prometheus' / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address={web}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "prometheus.log").open("w"),
    )
    try:
        wait(lambda: get(f"http://{web}/-/ready") is not None, prom, "prometheus ready")
        base = f"http://{web}"

        def collector_up() -> bool:
            found = [t for t in targets(base) if t["labels"]["job"] == "rlpulse-collector"]
            return bool(found) and found[0]["health"] == "up"

        # The exported config scrapes every 15 s; the first scrape comes within one interval.
        wait(collector_up, prom, f"the collector at {target} up", timeout=60)
        (found,) = [t for t in targets(base) if t["labels"]["job"] == "rlpulse-collector"]
        assert found["scrapeUrl"] == f"http://{target}/metrics"
        assert found["lastError"] == ""
    finally:
        prom.terminate()
        prom.wait(10)
        assert collector.stop() == 0
