"""deploy/grafana: the dashboards are what generate.py writes from the catalog, are well-formed
Grafana dashboard JSON, and the provisioning points at the compose Prometheus."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import yaml

from tests.deploy.conftest import DASHBOARDS, DEPLOY

GRAFANA = DEPLOY / "grafana"


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "rlpulse_grafana_generate", GRAFANA / "generate.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_dashboards_are_what_generate_py_writes(tmp_path: Path) -> None:
    gen = generator()
    assert gen.main([str(tmp_path)]) == 0
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == [p.name for p in DASHBOARDS]
    for path in DASHBOARDS:
        assert (tmp_path / path.name).read_text() == path.read_text(), (
            f"{path.name} is stale: run .venv/bin/python deploy/grafana/generate.py"
        )


def test_dashboards_are_well_formed() -> None:
    titles = {}
    uids = set()
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        assert board["uid"] not in uids and len(board["uid"]) <= 40
        uids.add(board["uid"])
        titles[path.name] = board["title"]
        assert "id" not in board  # provisioned dashboards must not carry a database id
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        ids, cells = set(), set()
        for panel in board["panels"]:
            assert panel["id"] not in ids
            ids.add(panel["id"])
            pos = panel["gridPos"]
            assert pos["x"] + pos["w"] <= 24 and pos["h"] > 0
            cell = (pos["x"], pos["y"])
            assert cell not in cells, f"{path.name}: panels overlap at {cell}"
            cells.add(cell)
            if panel["type"] == "row":  # a group header: no queries of its own
                assert pos["w"] == 24 and panel["title"] and panel["panels"] == []
                continue
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            refs = [t["refId"] for t in panel["targets"]]
            assert refs and len(set(refs)) == len(refs)
            for target in panel["targets"]:
                uses_run = "$run" in target["expr"]
                assert not uses_run or "run" in variables, f"{path.name}: {panel['title']}"
    assert sorted(titles.values()) == [
        "rlpulse / Memory by phase and device",
        "rlpulse / Pipeline health",
        "rlpulse / RL overview",
        "rlpulse / Serving",
        "rlpulse / Throughput and phase timings",
    ]


def test_provisioning_points_at_the_compose_prometheus_and_dashboards() -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    (source,) = yaml.safe_load(
        (GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )["datasources"]
    assert source["type"] == "prometheus" and source["isDefault"] is True
    assert source["url"] == "http://prometheus:9090"
    assert "prometheus" in compose["services"]
    (provider,) = yaml.safe_load(
        (GRAFANA / "provisioning" / "dashboards" / "rlpulse.yml").read_text()
    )["providers"]
    mounts = dict(
        v.rsplit(":", 1)[0].split(":", 1)
        for v in compose["services"]["grafana"]["volumes"]
        if v.startswith("./")
    )
    assert mounts["./grafana/dashboards"] == provider["options"]["path"]
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    home = compose["services"]["grafana"]["environment"][
        "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"
    ]
    assert Path(home).name in {p.name for p in DASHBOARDS}
