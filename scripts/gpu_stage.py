"""``make gpu-stage``: what a GPU machine needs beside the checkout to run ``scripts/gpu-check.sh``.

A GPU machine of the kind rlpulse is verified on has torch with CUDA, numpy, msgpack, psutil,
nvidia-ml-py, pytest and hypothesis, but no pyzmq, msgspec or Ray, and cannot reach a package
registry. This downloads those as wheels for its Python (``--python`` 3.12 by default), at the
versions this machine's ``.venv`` holds (what ``make test`` ran here), into ``.gpu-stage/``,
a folder ``.git/info/exclude`` ignores. Ray's wheel is 79 MB, over the 64 MiB a call to a GPU
machine may carry with the checkout, so the stage repacks it without the parts a local Ray never
loads (``SLIM``: the Java worker's jar, the dashboard's web client, the libraries on top of Ray),
and checks that the checkout and the stage together fit ``TRAVEL_LIMIT``.

    python scripts/gpu_stage.py [--dest .gpu-stage] [--python 3.12]

It writes ``MANIFEST.json`` beside the wheels: each wheel, its size, what was taken out of it,
and the travel size. ``tests/test_gpu_check.py`` reads it.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.metadata
import json
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEST = ".gpu-stage"
TRAVEL_LIMIT = 64 * 1024 * 1024
"""What one call to a GPU machine carries: the checkout's files and the carried folders."""
DISTRIBUTIONS = (
    "pyzmq",
    "msgspec",
    "ray",
    # Ray's one requirement that GPU machine lacks, and its own.
    "jsonschema",
    "jsonschema-specifications",
    "referencing",
    "rpds-py",
)
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
SLIM = (
    "ray/jars/",  # the Java worker (32 MB)
    "ray/dashboard/client/",  # the dashboard's web pages (include_dashboard=False)
    "ray/rllib/",
    "ray/tune/",
    "ray/train/",
    "ray/serve/",
    "ray/data/",
    "ray/llm/",
)
"""Parts of Ray's wheel that ``ray.init`` and actors never import."""


def pinned(names: tuple[str, ...]) -> list[str]:
    """``name==version`` for each distribution, at the version this environment holds."""
    out = []
    for name in names:
        try:
            out.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            raise SystemExit(
                f"gpu-stage: {name} is not installed here: run `make install` first"
            ) from None
    return out


def download(requirements: list[str], dest: Path, python: str) -> None:
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check"]
    cmd += ["--no-deps", "--only-binary=:all:", "--python-version", python]
    cmd += ["--implementation", "cp", *platforms, "-d", str(dest), *requirements]
    subprocess.run(cmd, check=True)


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def wheel_record(names: Iterable[str]) -> str:
    """The wheel's own RECORD (``NAME-VERSION.dist-info/RECORD`` at the top; vendored packages
    inside it have their own, deeper down)."""
    return next(n for n in names if n.count("/") == 1 and n.endswith(".dist-info/RECORD"))


def slim_wheel(path: Path, drop: tuple[str, ...]) -> int:
    """Rewrite the wheel at ``path`` without the members under ``drop``, its RECORD listing
    exactly what is left. Returns the number of members removed."""
    removed = 0
    with (
        zipfile.ZipFile(path) as src,
        tempfile.NamedTemporaryFile(dir=path.parent, suffix=".whl", delete=False) as tmp,
    ):
        record_name = wheel_record(src.namelist())
        rows = []
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
            for info in src.infolist():
                if info.filename.startswith(drop):
                    removed += 1
                    continue
                if info.filename == record_name:
                    continue
                data = src.read(info)
                out.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
                rows.append(f"{info.filename},{_record_hash(data)},{len(data)}")
            rows.append(f"{record_name},,")
            out.writestr(record_name, "\n".join(rows) + "\n")
    Path(tmp.name).chmod(0o644)
    Path(tmp.name).replace(path)
    return removed


def checkout_bytes() -> int:
    """The size of the files a call to a GPU machine sends: tracked and untracked, not ignored."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    return sum(
        (REPO / name.decode()).stat().st_size
        for name in listed
        if name and (REPO / name.decode()).is_file()
    )


def exclude(dest: str) -> None:
    """Make git ignore the stage in this clone, so it travels only where a call carries it."""
    info = REPO / ".git" / "info"
    if not info.parent.is_dir():  # not a plain clone (a worktree, an export): nothing to do
        return
    info.mkdir(exist_ok=True)
    path = info / "exclude"
    line = f"/{dest.strip('/')}/"
    lines = path.read_text().splitlines() if path.exists() else []
    if line not in lines:
        path.write_text("\n".join([*lines, line]) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", default=DEST)
    parser.add_argument("--python", default="3.12", help="the GPU machine's Python (X.Y)")
    args = parser.parse_args(argv)
    dest = REPO / args.dest
    dest.mkdir(parents=True, exist_ok=True)
    exclude(args.dest)
    for old in dest.glob("*.whl"):
        old.unlink()
    requirements = pinned(DISTRIBUTIONS)
    download(requirements, dest, args.python)
    wheels = sorted(dest.glob("*.whl"))
    removed: dict[str, int] = {}
    for wheel in wheels:
        if wheel.name.startswith("ray-"):
            removed[wheel.name] = slim_wheel(wheel, SLIM)
    stage = sum(w.stat().st_size for w in wheels)
    travel = checkout_bytes() + stage
    manifest = {
        "python": args.python,
        "requirements": requirements,
        "wheels": {w.name: w.stat().st_size for w in wheels},
        "removed_members": removed,
        "slim": list(SLIM),
        "stage_bytes": stage,
        "travel_bytes": travel,
        "travel_limit_bytes": TRAVEL_LIMIT,
    }
    (dest / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    mib = 1024 * 1024
    print(
        f"gpu-stage: {len(wheels)} wheels, {stage / mib:.1f} MiB in {args.dest}/; with the "
        f"checkout {travel / mib:.1f} MiB of {TRAVEL_LIMIT / mib:.0f} MiB"
    )
    if travel > TRAVEL_LIMIT:
        print(f"gpu-stage: over the {TRAVEL_LIMIT // mib} MiB a GPU call carries", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
