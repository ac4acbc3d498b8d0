"""A real collector writing JSON lines, and docs/integrations.md's code blocks, for the integration
tests."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rlpulse.collector.launch import CollectorProcess, start_collector
from tests.docs import doc_block

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def jsonl_collector(tmp_path: Path, trace: bool = False) -> Iterator[tuple[CollectorProcess, Path]]:
    """A collector on a free loopback port with one ``jsonl`` tracker (and, with ``trace``, a
    ``trace`` tracker writing under ``tmp_path/traces``: :func:`spans`); stopped (SIGTERM,
    drained, exit 0 checked) when the block ends."""
    out = tmp_path / "metrics.jsonl"
    config: dict = {"track_with": ["jsonl"], "tracker_kwargs": {"jsonl": {"path": str(out)}}}
    if trace:
        config["track_with"].append("trace")
        config["tracker_kwargs"]["trace"] = {"dir": str(tmp_path / "traces")}
    log = (tmp_path / "collector.log").open("w")
    collector = start_collector(config, stderr=log, stdout=subprocess.DEVNULL)
    try:
        yield collector, out
    finally:
        code = collector.stop()
        log.close()
    assert code == 0, (tmp_path / "collector.log").read_text()


def records(path: Path) -> dict[int, dict]:
    """The emitted steps by step number (each step must appear once)."""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    by_step = {r["step"]: r for r in lines}
    assert len(by_step) == len(lines), "a step was emitted twice"
    return by_step


def spans(tmp_path: Path, run: str) -> list[dict]:
    """The phase spans the ``trace`` tracker wrote for ``run``: ``{"role", "rank", "phase"
    (cluster/phase), "step", "seconds"}`` each."""
    from rlpulse.schemas.spans import trace_path

    events = json.loads(trace_path(tmp_path / "traces", run).read_text())
    roles = {
        e["pid"]: e["args"]["name"]
        for e in events
        if e.get("name") == "process_name" and e.get("pid")
    }
    return [
        {
            "role": roles[e["pid"]],
            "rank": e["tid"],
            "phase": e["args"]["phase"],
            "step": e["args"]["step"],
            "seconds": e["dur"] / 1e6,
        }
        for e in events
        if e.get("ph") == "X" and e.get("pid")
    ]


@contextmanager
def no_reads_from_rlpulse(modules: tuple[str, ...] = ("rlpulse.",)) -> Iterator[None]:
    """Tensor reads (``.item()``, ``.tolist()``, ``float()``...) and collectives fail the test
    when code of ``modules`` (rlpulse's, by default) makes them; the framework's own go
    through."""
    import pytest
    import torch
    import torch.distributed as dist

    def guard(owner, name):
        original = getattr(owner, name)

        def checked(*args, **kwargs):
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if caller.startswith(modules):
                pytest.fail(f"{caller} called {name}: the hook must not read tensors back")
            return original(*args, **kwargs)

        return owner, name, original, checked

    guards = [
        guard(torch.Tensor, m)
        for m in ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__")
    ] + [guard(dist, m) for m in ("all_reduce", "all_gather", "broadcast", "barrier")]
    for owner, name, _, checked in guards:
        setattr(owner, name, checked)
    try:
        yield
    finally:
        for owner, name, original, _ in guards:
            setattr(owner, name, original)


INTEGRATIONS_DOC = "docs/integrations.md"


def readme_block(heading: str, lang: str = "python", index: int = 0) -> str:
    """The ``index``-th ``lang`` code block under ``heading`` of docs/integrations.md, where the
    README's verl and TRL sections moved (the README keeps their first blocks, kept equal to
    these by tests/integration/test_readme_commands.py)."""
    return doc_block(INTEGRATIONS_DOC, heading, lang, index)


def samples_supported() -> bool:
    """Whether this tree's producer takes a ``Samples`` value (issue 41's producer change); a
    producer without it counts the value as invalid in ``log()``."""
    from rlpulse.producer import Producer, ProducerConfig, Samples

    probe = Producer(
        "tcp://127.0.0.1:9",  # nothing listens: the probe sends nothing
        run="probe",
        role="probe",
        rank=0,
        world_size=1,
        config=ProducerConfig(close_timeout_s=0.1),
    )
    try:
        probe.log({"probe/samples": Samples([{"score": 1.0}], key="score")}, step=0)
        return probe.stats()["invalid"] == 0
    finally:
        probe.close()


NO_SAMPLES = "this tree's producer does not take Samples yet (issue 41, engineer A's change)"
