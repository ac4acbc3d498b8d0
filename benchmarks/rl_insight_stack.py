"""RL-Insight's side of ``benchmarks.rl_insight``: its server (started and stopped with its CLI,
``rl-insight server``), the trainer-side config verl passes to ``rl_insight.init``, the hub actor
that ``init`` creates, and the hub's ``/metrics``.

>>> # server = RlInsightServer(workdir); server.start()
>>> # rl_insight.init(project="p", experiment_name="e", config=rl_insight_config(server, port))
>>> # scrape(port)["rl_insight_monitor_loss"]  # [(labels, value), ...]
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import psutil

from benchmarks.common import free_port

NAMESPACE = "rl_insight_monitor"
"""RL-Insight's default metric prefix (``server.namespace`` of its trainer config)."""


def skip_reason() -> str | None:
    """None when RL-Insight and Ray can be imported here, else why this benchmark cannot run."""
    for module, extra in (("rl_insight", "bench"), ("ray", "trainer")):
        if importlib.util.find_spec(module) is None:
            return f"`{module}` is not installed (`pip install -e '.[{extra}]'`, or `make bench`)"
    return None


# ---------------------------------------------------------------------------- RL-Insight


class RlInsightServer:
    """RL-Insight's HTTP server, started and stopped with its own CLI, every file under
    ``workdir``. The hub registers its ``/metrics`` with it and asks it for the trace endpoint;
    the observability services it can also run are switched off."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = workdir / "rl-insight.yaml"
        self.config.write_text(
            "server:\n"
            "  backend: local\n"
            f"  port: {self.port}\n"
            f"  install_dir: {workdir / 'install'}\n"
            f"  data_dir: {workdir / 'data'}\n"
            f"  runtime_dir: {workdir / 'runtime'}\n"
            f"  state_file: {workdir / 'state.json'}\n"
            "prometheus: {enable: false}\n"
            "tempo: {enable: false}\n"
            "grafana: {enable: false}\n"
        )

    def _cli(self, *args: str) -> None:
        cmd = [sys.executable, "-m", "rl_insight", "server", *args, "--config", str(self.config)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=120)

    def start(self) -> None:
        self._cli("start", "--detach")

    def stop(self) -> None:
        self._cli("stop")


def rl_insight_config(server: RlInsightServer, metrics_port: int) -> dict[str, Any]:
    """The trainer-side config verl passes as ``rlpulse.trainer.rl_insight``."""
    return {"server": {"url": server.url}, "prometheus": {"metrics_report_port": metrics_port}}


def hub_handle(config: dict[str, Any]) -> Any:
    """The job's hub actor (created by the first ``rl_insight.init`` of the job)."""
    from rl_insight.client.ray_monitor_client import get_or_create_monitor_hub
    from rl_insight.utils import load_monitor_config

    return get_or_create_monitor_hub(load_monitor_config(config))


def hub_process() -> psutil.Process | None:
    """The Ray worker that runs the hub actor: a descendant of this driver, by its title."""
    for proc in psutil.Process().children(recursive=True):
        try:
            if "MonitorHubActor" in " ".join(proc.cmdline()):
                return proc
        except psutil.Error:
            continue
    return None


def gauge_name(name: str, prefix: str = "") -> str:
    """The name ``/metrics`` shows for a gauge that verl reports as ``name``."""
    return f"{NAMESPACE}_{prefix}{name.replace('/', '_')}"


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The hub's ``/metrics``: gauge name -> [(labels, value)]."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {
        fam.name: [(dict(s.labels), s.value) for s in fam.samples]
        for fam in text_string_to_metric_families(text)
        if fam.type == "gauge"
    }
