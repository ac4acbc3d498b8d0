"""Static checks of what cannot run here (no Docker engine, no Kubernetes cluster): the compose
file, the Dockerfile, the systemd unit and the Kubernetes manifests agree with each other and
with the collector's configuration. ``kubectl kustomize`` and ``systemd-analyze verify`` run
too when those tools are installed (both work offline)."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.output.discovery import SD_PATH
from tests.deploy.conftest import DEPLOY, ROOT

K8S = DEPLOY / "k8s"
CONFIG_IN_CONTAINER = "/etc/rlpulse/collector.yaml"


def compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())


def collector_config() -> CollectorConfig:
    return CollectorConfig.load(DEPLOY / "collector.yaml")


def k8s() -> dict[str, dict[str, Any]]:
    docs = {}
    for path in sorted(K8S.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        assert {"apiVersion", "kind"} <= set(doc), path.name
        docs[doc["kind"]] = doc
    return docs


def test_collector_yaml_is_a_valid_config_listening_inside_the_container() -> None:
    config = collector_config()
    assert config.bind == "tcp://0.0.0.0:5555"
    assert config.trackers["prometheus"] == {"host": "0.0.0.0", "port": 9464}
    assert config.state_dir and config.trackers["jsonl"]["path"].startswith("/var/lib/rlpulse/")


def test_compose_services_mounts_ports_and_scrape_target_agree() -> None:
    spec = compose()
    services = spec["services"]
    assert set(services) == {"collector", "prometheus", "grafana"}
    build = services["collector"]["build"]
    assert (DEPLOY / build["context"] / build["dockerfile"]).is_file()
    assert services["collector"]["command"] == ["--config", CONFIG_IN_CONTAINER]
    named = set(spec["volumes"])
    for name, service in services.items():
        assert "image" in service, name
        for volume in service.get("volumes", []):
            source, target = volume.split(":")[:2]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), f"{name}: {source} is missing"
            else:
                assert source in named, f"{name}: volume {source} is not declared"
            assert target.startswith("/")
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name}: {port} is published beyond loopback"
    mounts = {v.split(":")[1]: v.split(":")[0] for v in services["collector"]["volumes"]}
    assert mounts[CONFIG_IN_CONTAINER] == "./collector.yaml"
    config = collector_config()
    published = {p.split(":")[2] for p in services["collector"]["ports"]}
    prom_port = str(config.trackers["prometheus"]["port"])
    assert published == {config.bind.rsplit(":", 1)[1], prom_port}
    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in prometheus["scrape_configs"]}
    assert set(jobs) == {"rlpulse-collector", "rlpulse-endpoints"}
    assert jobs["rlpulse-collector"]["static_configs"][0]["targets"] == [f"collector:{prom_port}"]
    (sd,) = jobs["rlpulse-endpoints"]["http_sd_configs"]  # the same server's service discovery
    assert sd["url"] == f"http://collector:{prom_port}{SD_PATH}"
    prom_mounts = {v.split(":")[0]: v.split(":")[1] for v in services["prometheus"]["volumes"]}
    assert prom_mounts["./prometheus/prometheus.yml"] == "/etc/prometheus/prometheus.yml"
    assert prom_mounts["./prometheus/rules"] == "/etc/prometheus/rules"  # rules/*.yml, relative


def test_dockerfile_installs_the_collector_only_and_runs_the_compose_command() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    for source in re.findall(r"^COPY (\S+)", text, re.M):
        assert (ROOT / source).exists(), source
    assert "trainer" not in re.search(r"^ARG EXTRAS=(.*)$", text, re.M).group(1)
    assert 'ENTRYPOINT ["rlpulse", "collector"]' in text
    assert f'CMD ["--config", "{CONFIG_IN_CONTAINER}"]' in text
    assert set(re.search(r"^EXPOSE (.*)$", text, re.M).group(1).split()) == {"5555", "9464"}
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text()
    packages = (
        "rlpulse",
        "schemas",
        "producer",
        "collector",
        "runtools",
        "trainer",
        "deploy",
        "wire",
    )
    assert all(f"!{d}/**" in ignore for d in packages)


def test_systemd_unit_runs_the_collector_and_verifies(tmp_path: Path) -> None:
    path = DEPLOY / "systemd" / "rlpulse-collector.service"
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(path)
    assert unit["Service"]["ExecStart"].endswith(
        f"-m rlpulse.collector --config {CONFIG_IN_CONTAINER}"
    )
    assert unit["Service"]["KillSignal"] == "SIGTERM"
    # reload: the sinks reopen their files (SIGHUP; tests/integration/test_log_rotation.py)
    assert unit["Service"]["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert unit["Service"]["RestartPreventExitStatus"] == "2"  # a config error is not retried
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    analyze = shutil.which("systemd-analyze")
    if analyze:  # offline; the unit's interpreter path must exist, so point it at this one
        local = path.read_text().replace("/opt/rlpulse/bin/python", sys.executable)
        copy = tmp_path / path.name
        copy.write_text(local)
        done = subprocess.run(
            [analyze, "verify", str(copy)], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stdout + done.stderr


def test_kubernetes_manifests_select_each_other() -> None:
    docs = k8s()
    assert set(docs) == {"ConfigMap", "Deployment", "Service", "ServiceMonitor", "Kustomization"}
    for kind, doc in docs.items():
        if kind != "Kustomization":
            assert doc["metadata"]["name"] and ("spec" in doc or "data" in doc), kind
    dep, svc, mon, cm = (docs[k] for k in ("Deployment", "Service", "ServiceMonitor", "ConfigMap"))
    assert dep["apiVersion"] == "apps/v1" and svc["apiVersion"] == "v1"
    assert mon["apiVersion"] == "monitoring.coreos.com/v1"
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    container_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    service_ports = {p["name"]: p for p in svc["spec"]["ports"]}
    for port in service_ports.values():
        assert port["targetPort"] in container_ports
    assert mon["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert [e["port"] for e in mon["spec"]["endpoints"]] == ["metrics"]
    assert "metrics" in service_ports
    # the job label the alert rules select is the Service's name
    assert svc["metadata"]["name"] == "rlpulse-collector"
    # the ConfigMap holds deploy/collector.yaml; the container reads it where compose puts it
    assert yaml.safe_load(cm["data"]["collector.yaml"]) == yaml.safe_load(
        (DEPLOY / "collector.yaml").read_text()
    )
    config = collector_config()
    assert container_ports == {
        "zmq": int(config.bind.rsplit(":", 1)[1]),
        "metrics": config.trackers["prometheus"]["port"],
    }
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert (
        volumes[mounts[str(Path(CONFIG_IN_CONTAINER).parent)]]["configMap"]["name"]
        == (cm["metadata"]["name"])
    )
    assert container["args"] == ["--config", CONFIG_IN_CONTAINER]
    assert sorted(docs["Kustomization"]["resources"]) == sorted(
        p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml"
    )
    kubectl = shutil.which("kubectl")
    if kubectl:  # renders the kustomization offline: every resource parses and is named
        done = subprocess.run(
            [kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        kinds = [d["kind"] for d in yaml.safe_load_all(done.stdout)]
        assert sorted(kinds) == ["ConfigMap", "Deployment", "Service", "ServiceMonitor"]
