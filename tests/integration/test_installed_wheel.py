"""rlpulse as a user installs it into their own stack: the wheel holds one top-level package,
``rlpulse``; installed into a fresh virtual environment outside the repository, and run from a
working directory that holds packages of its own named ``schemas``, ``trainer``,
``collector`` and ``producer``, its ``rlpulse collector`` merges two producer processes
exactly, and ``rlpulse deploy export`` writes rules that promtool accepts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import pytest

from tests.support.net import free_port

ROOT = Path(__file__).resolve().parents[2]
SHADOWS = ("schemas", "trainer", "collector", "producer")
WHEELHOUSE = ROOT / ".wheelhouse"
"""The base install's dependencies (``make wheelhouse``): the test runs without a network."""

PRODUCER = textwrap.dedent(
    """
    import sys
    import collector, producer, schemas, trainer  # the user's own packages, not rlpulse's
    assert all(m.MINE for m in (collector, producer, schemas, trainer))
    from rlpulse import Producer, Weighted
    from rlpulse.schemas import metrics as M

    rank = int(sys.argv[2])
    p = Producer(sys.argv[1], run="mine", role="actor_train", rank=rank, world_size=2)
    for step in range(3):
        p.log({M.ACTOR_PG_LOSS.name: Weighted(float(rank + step), 10 * (rank + 1))}, step=step)
    p.close()
    sys.exit(0 if p.stats()["unacked"] == 0 else 3)
    """
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(ROOT),
        ],
        check=True,
        cwd=tmp_path_factory.mktemp("build"),
    )
    (path,) = out.glob("rlpulse-*.whl")
    return path


def test_the_wheel_holds_one_top_level_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {
        "rlpulse",
        wheel.name.split("-py")[0] + ".dist-info",
    }
    for wanted in (
        "rlpulse/producer/client.py",
        "rlpulse/collector/daemon.py",
        "rlpulse/schemas/PROTOCOL.md",
        "rlpulse/trainer/configs/demo.yaml",
        "rlpulse/deploy/prometheus/rules/rlpulse-rl.yml",
        "rlpulse/deploy/grafana/dashboards/rlpulse-rl-overview.json",
    ):
        assert wanted in names, wanted
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "rlpulse = rlpulse.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


def test_installed_where_packages_of_the_same_names_live(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py, cli = venv / "bin" / "python", venv / "bin" / "rlpulse"
    if not WHEELHOUSE.is_dir():
        pytest.skip("no .wheelhouse: `make wheelhouse` (make test does it) downloads the deps")
    subprocess.run(
        [
            str(py),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--no-index",
            "--find-links",
            str(WHEELHOUSE),
            str(wheel),
        ],
        check=True,
    )
    work = tmp_path / "work"  # the user's project: its own schemas/, trainer/, ...
    for name in SHADOWS:
        (work / name).mkdir(parents=True)
        (work / name / "__init__.py").write_text("MINE = True\n")
    (work / "worker.py").write_text(PRODUCER)
    (work / "collector.yaml").write_text(
        "track_with: [jsonl]\ntracker_kwargs:\n  jsonl: {path: out.jsonl}\nsettle_s: 0\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = str(work)  # the user's packages come first on the path
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    collector = subprocess.Popen(
        [str(cli), "collector", "--config", "collector.yaml", "--bind", address],
        cwd=work,
        env=env,
        stderr=(tmp_path / "collector.log").open("w"),
        stdout=subprocess.DEVNULL,
    )
    try:
        time.sleep(1.0)
        workers = [
            subprocess.Popen([str(py), "worker.py", address, str(r)], cwd=work, env=env)
            for r in range(2)
        ]
        assert [w.wait(120) for w in workers] == [0, 0]
    finally:
        collector.terminate()
        assert collector.wait(60) == 0, (tmp_path / "collector.log").read_text()
    records = [json.loads(line) for line in (work / "out.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    for r in records:  # token-weighted: (step * 10 + (step + 1) * 20) / 30
        step = r["step"]
        assert not r["partial"]
        assert r["metrics"]["actor/pg_loss"] == pytest.approx((step * 10 + (step + 1) * 20) / 30)

    exported = tmp_path / "monitoring"
    done = subprocess.run(
        [str(cli), "deploy", "export", str(exported)], cwd=work, env=env, capture_output=True
    )
    assert done.returncode == 0, done.stderr
    for path in ("docker-compose.yml", "collector.yaml", "prometheus/prometheus.yml"):
        assert (exported / path).is_file(), path
    assert len(list((exported / "grafana" / "dashboards").glob("*.json"))) >= 5
    again = subprocess.run([str(cli), "deploy", "export", str(exported)], capture_output=True)
    assert again.returncode == 2 and b"--force" in again.stderr
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed: run scripts/install-system-deps.sh")
    rules = sorted(str(p) for p in (exported / "prometheus" / "rules").glob("*.yml"))
    subprocess.run([promtool, "check", "rules", *rules], check=True, capture_output=True)
    subprocess.run(
        [promtool, "check", "config", str(exported / "prometheus" / "prometheus.yml")],
        check=True,
        capture_output=True,
    )
    tests = sorted(str(p) for p in (exported / "prometheus" / "tests").glob("*.yml"))
    subprocess.run(
        [promtool, "test", "rules", *tests],
        check=True,
        capture_output=True,
        cwd=exported / "prometheus" / "tests",
    )


def test_every_package_folder_is_in_rlpulse_and_linked_from_the_top() -> None:
    """The packages live in ``rlpulse/`` (what the wheel's package search finds and what a
    static reader resolves ``rlpulse.*`` to); each top-level folder a reader looks for
    (``producer/``, ``collector/``...) is a relative symlink to its package."""
    from setuptools import find_packages

    packages = {p.parent.name for p in (ROOT / "rlpulse").glob("*/__init__.py")}
    assert {"producer", "collector", "schemas", "wire", "trainer", "runtools", "deploy"} <= packages
    for name in packages:
        link = ROOT / name
        assert link.is_symlink() and link.readlink() == Path("rlpulse", name), name
        assert not (ROOT / "rlpulse" / name).is_symlink(), name
    found = set(find_packages(str(ROOT), include=["rlpulse*"]))
    wanted = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "rlpulse").rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert wanted == found, wanted ^ found


def test_root_is_lazy() -> None:
    """Importing the catalog, the wire or the collector loads no producer code (PEP 562 root),
    and ``from rlpulse import Producer`` still works."""
    code = (
        "import sys, rlpulse.schemas.metrics, rlpulse.wire.transport, rlpulse.collector.daemon\n"
        "assert not [m for m in sys.modules if m.startswith('rlpulse.producer')], sys.modules\n"
        "from rlpulse import Producer, ProducerConfig, Masked\n"
        "assert Producer.__module__ == 'rlpulse.producer.client'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)


def test_mypy_resolves_the_checkout() -> None:
    """A static reader of the plain checkout (mypy here, as an IDE does) resolves
    ``rlpulse.*`` imports with no install-time hook: mypy is told not to read site-packages,
    where the editable install's finder lives."""
    mypy = shutil.which("mypy", path=str(Path(sys.executable).parent))
    if mypy is None:
        pytest.skip("mypy is not installed (the dev extra)")
    code = (
        "from rlpulse.producer.client import Producer\n"
        "from rlpulse.collector.daemon import Collector\n"
        "reveal_type(Producer.log)\n"
        "reveal_type(Collector.run)\n"
    )
    out = subprocess.run(
        [
            mypy,
            "--no-site-packages",
            "--ignore-missing-imports",
            "--follow-imports=silent",
            "--no-incremental",
            "-c",
            code,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert "rlpulse.producer.client.Producer" in out.stdout, out.stdout
    assert "rlpulse.collector.daemon.Collector" in out.stdout, out.stdout
