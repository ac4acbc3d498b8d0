"""A command whose optional extra is missing says which one to install, in one line, instead of
ending in a ``ModuleNotFoundError`` traceback (``rlpulse serve`` and ``rlpulse train`` did;
``rlpulse report`` already said so). One helper, ``rlpulse.extras.needs_extra``, for all."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# A fresh interpreter where ``missing`` cannot be imported, running ``rlpulse ARGS``.
DRIVER = """
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None  # import raises ModuleNotFoundError, as if not installed
from rlpulse.cli import main
sys.exit(main(sys.argv[2:]))
"""


def rlpulse_without(missing: str, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", DRIVER, missing, *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )


@pytest.mark.parametrize(
    ("missing", "argv", "says"),
    [
        ("uvicorn", ("serve", "--model", "nowhere"), "rlpulse serve needs uvicorn"),
        ("fastapi", ("serve", "--model", "nowhere"), "pip install 'rlpulse[serve]'"),
        ("ray", ("train", "--steps", "1"), "rlpulse train needs ray"),
        ("ray", ("train", "--steps", "1"), "pip install 'rlpulse[trainer]'"),
        ("torch", ("serve", "--model", "nowhere"), "pip install torch first"),
        ("matplotlib", ("report", "run.jsonl"), "pip install 'rlpulse[report]'"),
    ],
)
def test_a_missing_extra_is_named_not_a_traceback(
    tmp_path: Path, missing: str, argv: tuple[str, ...], says: str
) -> None:
    (tmp_path / "run.jsonl").write_text('{"run": "r", "step": 0, "metrics": {"a": 1.0}}\n')
    done = rlpulse_without(missing, *argv, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr
    assert "Traceback" not in done.stderr


def test_a_missing_rlpulse_module_is_a_bug_not_an_extra() -> None:
    from rlpulse.extras import MissingExtra, needs_extra

    with pytest.raises(ModuleNotFoundError) as caught, needs_extra("serve", "rlpulse serve"):
        import rlpulse.no_such_module  # noqa: F401
    assert not isinstance(caught.value, MissingExtra)
