"""``make gpu-stage`` and ``scripts/gpu-check.sh``, on this machine (no GPU): the stage fits what a
call to a GPU machine carries and holds what that machine lacks; without CUDA the check says so
in one line and exits 2; the merge check, run on CPU tensors, passes and its verdict catches a
wrong number."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from scripts import gpu_check, gpu_stage

REPO = Path(__file__).resolve().parent.parent
STAGE = REPO / gpu_stage.DEST


@pytest.fixture(scope="module")
def manifest() -> dict:
    path = STAGE / "MANIFEST.json"
    assert path.exists(), f"{path} is missing: `make gpu-stage` (make test runs it first)"
    return json.loads(path.read_text())


def test_without_a_gpu_the_check_says_so_in_one_line_and_exits_2() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: scripts/gpu-check.sh would run the checks")
    proc = subprocess.run(
        ["bash", "scripts/gpu-check.sh"],
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "no CUDA device" in lines[0], proc.stderr


def test_the_stage_fits_one_gpu_call_with_the_checkout(manifest: dict) -> None:
    stage = sum(p.stat().st_size for p in STAGE.glob("*.whl"))
    travel = gpu_stage.checkout_bytes() + stage
    assert stage == manifest["stage_bytes"]
    assert travel <= gpu_stage.TRAVEL_LIMIT, f"{travel / 2**20:.1f} MiB travel"
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", str(STAGE / "MANIFEST.json")], cwd=REPO, check=False
    )
    assert ignored.returncode == 0, "the stage must be ignored by git (it travels when carried)"


def test_the_stage_holds_what_the_gpu_machine_lacks_at_the_versions_tested_here(
    manifest: dict,
) -> None:
    wheels = {p.name for p in STAGE.glob("*.whl")}
    assert set(manifest["wheels"]) == wheels
    py = "cp" + manifest["python"].replace(".", "")
    for dist in gpu_stage.DISTRIBUTIONS:
        version = importlib.metadata.version(dist)
        prefix = f"{dist.replace('-', '_')}-{version}-"
        (wheel,) = [w for w in wheels if w.startswith(prefix)]
        tags = wheel[len(prefix) : -len(".whl")]
        assert tags.startswith((f"{py}-", "py3-none-any")), wheel
        assert "macosx" not in tags and "win" not in tags and "aarch64" not in tags, wheel


def test_the_slim_ray_wheel_is_whole_without_what_ray_init_never_loads(manifest: dict) -> None:
    (ray,) = STAGE.glob("ray-*.whl")
    with zipfile.ZipFile(ray) as z:
        names = set(z.namelist())
        record_name = gpu_stage.wheel_record(names)
        record = {}
        for line in z.read(record_name).decode().splitlines():
            path, digest, size = line.rsplit(",", 2)
            record[path] = (digest, size)
        assert set(record) == names, "RECORD must list exactly the wheel's members"
        for name in names - {record_name}:
            data = z.read(name)
            want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert record[name] == (f"sha256={want}", str(len(data))), name
        assert not [n for n in names if n.startswith(gpu_stage.SLIM)]
        for binary in ("ray/_raylet.so", "ray/core/src/ray/raylet/raylet"):
            assert binary in names
        raylet = z.getinfo("ray/core/src/ray/raylet/raylet")
        assert (raylet.external_attr >> 16) & 0o111, "the raylet must stay executable"
    assert manifest["removed_members"][ray.name] > 0


def test_the_gpu_tests_are_found() -> None:
    files = gpu_check.gpu_test_files()
    assert "tests/producer/test_gpu.py" in files
    assert all(f.startswith("tests/") and "frameworks" not in f for f in files)


@pytest.mark.timeout(180)
def test_the_merge_check_passes_on_cpu_tensors(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "scripts/gpu_check.py",
            "merge",
            "--device",
            "cpu",
            "--out",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])["rows"]
    assert [r["met"] for r in rows] == [True, True], rows
    # The verdict catches a wrong number: one value a relative 1e-6 off, one quantile 2% off.
    records = {
        r["step"]: r for r in map(json.loads, (tmp_path / "merge.jsonl").read_text().splitlines())
    }
    assert gpu_check.compare(records, "cpu")[0] == []
    name = "check/bfloat16_masked/mean"
    records[1]["metrics"][name] *= 1 + 1e-6
    records[0]["metrics"][f"{gpu_check.DIST}/p90"] *= 1.02
    wrong, _, dist_err = gpu_check.compare(records, "cpu")
    assert len(wrong) == 1 and name in wrong[0]
    assert dist_err > 0.01
