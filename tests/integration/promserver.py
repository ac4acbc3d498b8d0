"""A real Prometheus server on loopback, for the integration tests: started on a scrape
configuration, asked through its HTTP API.

Needs the ``prometheus`` binary (Debian package ``prometheus``, installed by
``scripts/install-system-deps.sh``, which ``make test`` runs first); tests skip without it.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.net import free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def need(binary: str) -> None:
    if not Path(binary).exists():
        pytest.skip(f"{Path(binary).name} is not installed: run scripts/install-system-deps.sh")


def static_job(target: str) -> str:
    """A scrape job ``rlpulse`` of one ``host:port``."""
    return f"  - job_name: rlpulse\n    static_configs: [{{targets: ['{target}']}}]\n"


@contextlib.contextmanager
def prometheus(tmp_path: Path, jobs: str) -> Iterator[str]:
    """A Prometheus server running the scrape ``jobs`` (YAML items of ``scrape_configs``)
    every second; yields its base URL."""
    need(PROMETHEUS)
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\nscrape_configs:\n" + jobs
    )
    web = f"127.0.0.1:{free_port()}"
    with (tmp_path / "prometheus.log").open("w") as log:
        proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address={web}",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        try:
            wait(lambda: get(f"http://{web}/-/ready") is not None, proc, "prometheus ready")
            yield f"http://{web}"
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def get(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.read()
    except OSError:
        return None


def wait(
    ready: Callable[[], bool], proc: subprocess.Popen, what: str, timeout: float = 30.0
) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"prometheus exited ({proc.returncode}) waiting for {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def query(base: str, promql: str) -> list[dict]:
    body = get(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}")
    if body is None:
        return []
    answer = json.loads(body)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def targets(base: str) -> list[dict]:
    """The active targets: scrape URL, health, last error and labels."""
    body = get(f"{base}/api/v1/targets")
    active = json.loads(body)["data"]["activeTargets"] if body else []
    return [{k: t.get(k) for k in ("scrapeUrl", "health", "lastError", "labels")} for t in active]


def scraped(base: str, promql: str, timeout: float = 30.0) -> list[dict]:
    """The query's result once Prometheus has scraped something for it."""
    deadline = time.monotonic() + timeout
    while not (result := query(base, promql)):
        assert time.monotonic() < deadline, f"nothing for {promql}: {targets(base)}"
        time.sleep(0.3)
    return result
