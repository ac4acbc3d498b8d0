"""Paths and tools the deploy tests share."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
RULES = sorted((DEPLOY / "prometheus" / "rules").glob("*.yml"))
RULE_TESTS = sorted((DEPLOY / "prometheus" / "tests").glob("*.yml"))
DASHBOARDS = sorted((DEPLOY / "grafana" / "dashboards").glob("*.json"))
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


@pytest.fixture
def promtool() -> str:
    if not Path(PROMTOOL).exists():
        pytest.skip("promtool is not installed: run scripts/install-system-deps.sh")
    return PROMTOOL
