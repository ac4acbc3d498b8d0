"""promtool on deploy/prometheus: the config and rules are valid, the alert unit tests pass,
and every Grafana dashboard query is valid PromQL (checked as recording rules)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tests.deploy.conftest import DASHBOARDS, DEPLOY, RULE_TESTS, RULES
from tests.deploy.promql import dashboard_queries, grafana_to_promql, rule_queries


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_promtool_check_config(promtool: str) -> None:
    done = run(promtool, "check", "config", str(DEPLOY / "prometheus" / "prometheus.yml"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(RULES)} rule files found" in done.stdout + done.stderr


def test_promtool_check_rules(promtool: str) -> None:
    assert [p.name for p in RULES] == [
        "rlpulse-pipeline.yml",
        "rlpulse-rl.yml",
        "rlpulse-serve.yml",
    ]
    done = run(promtool, "check", "rules", *map(str, RULES))
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_test_rules(promtool: str) -> None:
    done = run(promtool, "test", "rules", *map(str, RULE_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("SUCCESS") == len(RULE_TESTS) == 3


def test_every_alert_has_a_unit_test_that_fires_it() -> None:
    alerts = {q.where.split(": ")[1] for path in RULES for q in rule_queries(path)}
    fired = set()
    for path in RULE_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                if case.get("exp_alerts"):
                    fired.add(case["alertname"])
    assert alerts == fired


def test_dashboard_queries_are_valid_promql(promtool: str, tmp_path: Path) -> None:
    queries = [q for path in DASHBOARDS for q in dashboard_queries(path)]
    assert len(queries) > 40
    rules = [
        {"record": f"check:query_{i}", "expr": grafana_to_promql(q.expr)}
        for i, q in enumerate(queries)
    ]
    path = tmp_path / "dashboards-as-rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    done = run(promtool, "check", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
