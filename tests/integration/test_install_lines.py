"""The README's install line leaves a user's environment as it was (issue 45, item 9): it said
``pip install torch==2.13.0``, which replaces a CUDA torch, and its extras ``verl`` and ``trl``
pinned exact framework versions, which replace a verl or TRL the user already runs.

A fresh virtual environment stands for a verl/TRL user's: stand-in distributions ``torch
2.5.1+cu121``, ``verl 0.8.0`` and ``trl 0.19.0`` (tiny local wheels of those names and
versions) installed in it, and a stand-in ``torch 2.13.0`` offered beside rlpulse's
dependencies (the wheelhouse ``make wheelhouse`` fills: no registry). The README's block for
such an environment, run as written (``/path/to/rlpulse`` is this checkout's wheel), must leave
the three as they were and rlpulse importable.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from rlpulse.producer.integrations.trl_loss import TESTED_TRL
from rlpulse.producer.integrations.verl_compat import TESTED_VERL
from tests.docs import doc_block
from tests.integration.test_installed_wheel import WHEELHOUSE, wheel  # noqa: F401 (fixture)
from tests.integration.test_readme_commands import commands

USERS = {"torch": "2.5.1+cu121", "verl": "0.8.0", "trl": "0.19.0"}
"""What the stand-in user's environment holds."""


def extras(built: Path) -> dict[str, list[Requirement]]:
    """The extras of the wheel built from this checkout, as pip reads them (its METADATA)."""
    with zipfile.ZipFile(built) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = zf.read(name).decode()
    found: dict[str, list[Requirement]] = {}
    for line in metadata.splitlines():
        if line.startswith("Requires-Dist: "):
            requirement = Requirement(line.removeprefix("Requires-Dist: "))
            match = re.search(r'extra == "([\w-]+)"', str(requirement.marker))
            if match:
                found.setdefault(match.group(1), []).append(requirement)
    return found


def test_the_framework_extras_are_ranges_around_the_tested_versions(
    wheel: Path,  # noqa: F811 (the fixture)
) -> None:
    """``verl`` and ``trl``: a range, the minor versions the loss hooks accept
    (``TESTED_VERL``, ``TESTED_TRL``); ``integrations``: the exact versions the tests run
    (what ``make install-integrations`` installs), inside those ranges. No extra names torch
    (``vllm``'s vLLM pins one of its own: ``make install`` installs it after torch)."""
    found = extras(wheel)
    pinned = {r.name: r.specifier for r in found["integrations"]}
    for name, tested in (("verl", TESTED_VERL), ("trl", TESTED_TRL)):
        (requirement,) = found[name]
        assert requirement.name == name and "==" not in str(requirement.specifier), requirement
        (exact,) = pinned[name]
        assert exact.operator == "==" and requirement.specifier.contains(exact.version)
        for minor in tested:
            major, low = map(int, minor.split("."))
            assert requirement.specifier.contains(f"{minor}.0")
            assert requirement.specifier.contains(f"{minor}.99")
            assert not requirement.specifier.contains(f"{major}.{low + 1}.0")
            assert not requirement.specifier.contains(f"{major}.{low - 1}.99" if low else "0")
    for extra, requirements in found.items():
        assert "torch" not in {r.name for r in requirements}, extra


def stand_in_wheel(folder: Path, name: str, version: str) -> Path:
    """A wheel of ``name`` ``version`` holding only ``name/__init__.py`` with its version."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f'__version__ = "{version}"\n',
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: rlpulse-tests\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    files[f"{dist}/RECORD"] = "\n".join([*record, f"{dist}/RECORD,,"]) + "\n"
    out = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    return out


def readme_install_block() -> str:
    return doc_block("README.md", "## Installing rlpulse into your own stack", "bash")


def installed(pip: list[str]) -> dict[str, str]:
    listed = subprocess.run(
        [*pip, "list", "--format", "json", "--disable-pip-version-check"],
        check=True,
        capture_output=True,
        text=True,
    )
    return {p["name"].lower(): p["version"] for p in json.loads(listed.stdout)}


def test_the_readme_install_keeps_an_existing_environments_torch_and_framework(
    wheel: Path,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    if not WHEELHOUSE.is_dir():
        pytest.skip("no .wheelhouse: `make wheelhouse` (make test does it) downloads the deps")
    standins = tmp_path / "standins"
    standins.mkdir()
    for name, version in (*USERS.items(), ("torch", "2.13.0")):
        stand_in_wheel(standins, name, version)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    offline = ["--no-index", "--find-links", str(WHEELHOUSE), "--find-links", str(standins)]
    quiet = ["-q", "--disable-pip-version-check"]
    users = [f"{name}=={version}" for name, version in USERS.items()]
    subprocess.run([*pip, "install", *quiet, *offline, *users], check=True)

    lines = commands(readme_install_block())
    assert lines and all(line.startswith("pip install ") for line in lines), lines
    for line in lines:  # as written, /path/to/rlpulse being this checkout's wheel
        args = [a.strip("'").replace("/path/to/rlpulse", str(wheel)) for a in line.split()[2:]]
        done = subprocess.run(
            [*pip, "install", *quiet, *offline, *args], capture_output=True, text=True
        )
        assert done.returncode == 0, (line, done.stderr[-2000:])
        versions = installed(pip)
        assert {name: versions.get(name) for name in USERS} == USERS, line
    assert "rlpulse" in versions
    probe = "import rlpulse, torch; from rlpulse import Producer; print(torch.__version__)"
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == 0 and done.stdout.strip() == USERS["torch"], done.stderr
