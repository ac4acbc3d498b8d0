"""``python -m rlpulse.collector``'s own commands: ``--help`` lists every command, and ``keygen``
never replaces an existing key pair unless told to (issue 17, item 6)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import zmq.auth

from rlpulse.collector.__main__ import main


def test_help_names_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for command in ("--config", "keygen"):
        assert f"python -m rlpulse.collector {command}" in out, out


def test_the_rlpulse_command_names_every_tool(capsys: pytest.CaptureFixture[str]) -> None:
    from rlpulse.cli import COMMANDS, main as rlpulse

    assert rlpulse(["--help"]) == 0
    out = capsys.readouterr().out
    for command in COMMANDS:
        assert f"rlpulse {command}" in out, command
    assert rlpulse(["nonsense"]) == 2


def test_keygen_makes_a_pair_and_refuses_to_overwrite_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = tmp_path / "keys"
    assert main(["keygen", str(keys), "worker"]) == 0
    public, secret = keys / "worker.key", keys / "worker.key_secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    before = zmq.auth.load_certificate(str(secret))
    capsys.readouterr()

    assert main(["keygen", str(keys), "worker"]) == 2
    err = capsys.readouterr().err
    assert str(public) in err and "--force" in err and "refusing to overwrite" in err
    assert zmq.auth.load_certificate(str(secret)) == before  # untouched

    public.unlink()  # half a pair left: still refused, the secret key may be in use
    assert main(["keygen", str(keys), "worker"]) == 2
    assert str(secret) in capsys.readouterr().err
    assert zmq.auth.load_certificate(str(secret)) == before

    assert main(["keygen", str(keys), "worker", "--force"]) == 0
    assert zmq.auth.load_certificate(str(secret)) != before
    assert public.is_file()
