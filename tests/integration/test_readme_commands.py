"""The README's commands, run as written by someone who has never seen rlpulse, and
docs/security.md (the README's former "Exposing the collector safely") run as a user runs it:
its keygen commands, its YAML, its environment variables, workers started together. Every step
must be whole (issue 17: with only public keys in ``clients_dir`` nothing was applied).

Every shell block of README.md is either run here or listed in ``SKIPPED`` with the reason;
a new block that is neither fails :func:`test_every_readme_shell_block_is_run_or_skipped`."""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from tests.docs import FENCE, ROOT, doc_block, doc_blocks, doc_section

RANKS, STEPS = 4, 5
SECURITY = "docs/security.md"
BIN = Path(sys.executable).parent


WORKER = textwrap.dedent(
    """
    import sys
    from rlpulse.producer import Producer, Weighted
    from rlpulse.schemas import metrics as M

    rank = int(sys.argv[1])
    p = Producer(run="curve", role="actor_train", rank=rank, world_size=int(sys.argv[2]))
    for step in range(int(sys.argv[3])):
        p.log({M.ACTOR_PG_LOSS.name: Weighted(float(rank), 10)}, step=step)
    p.close()
    sys.exit(0 if p.stats()["unacked"] == 0 and p.stats()["dropped_send"] == 0 else 3)
    """
)


def test_curve_exactly_as_the_readme_lays_out_the_keys(tmp_path) -> None:
    section = doc_section(SECURITY, "# Exposing the collector safely")
    (commands,) = doc_blocks(SECURITY, "# Exposing the collector safely", "bash")
    (config_text,) = doc_blocks(SECURITY, "# Exposing the collector safely", "yaml")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for line in commands.splitlines():
        command = line.split("#")[0].strip()
        if command:
            command = re.sub(r"^python ", f"{sys.executable} ", command)
            command = re.sub(r"^rlpulse ", f"{Path(sys.executable).parent / 'rlpulse'} ", command)
            subprocess.run(command, shell=True, cwd=tmp_path, env=env, check=True)
    assert sorted(p.name for p in (tmp_path / "keys" / "clients").iterdir()) == ["worker.key"]

    out = tmp_path / "out.jsonl"
    config = yaml.safe_load(config_text)
    config.update(track_with=["jsonl"], tracker_kwargs={"jsonl": {"path": str(out)}})
    (tmp_path / "collector.yaml").write_text(yaml.safe_dump(config))
    log = tmp_path / "collector.log"
    ready = tmp_path / "ready"
    # The page binds 0.0.0.0:5555; tests bind loopback on a free port (--bind, as documented).
    command = [sys.executable, "-m", "rlpulse.collector", "--config", "collector.yaml"]
    collector = subprocess.Popen(
        [*command, "--bind", "tcp://127.0.0.1:*", "--ready-file", str(ready)],
        cwd=tmp_path,
        env=env,
        stderr=log.open("w"),
    )
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert collector.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.02)
    address = ready.read_text().strip()

    worker_env = dict(env)
    for name, value in re.findall(r"`(RLPULSE_[A-Z_]+)=([^`]+)`", section):
        worker_env[name] = value
    worker_env["RLPULSE_ADDRESS"] = address  # the page's collector-host, here
    assert {"RLPULSE_CURVE_SERVER_KEY", "RLPULSE_CURVE_CLIENT_CERT"} <= set(worker_env)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    try:
        workers = [
            subprocess.Popen(
                [sys.executable, str(script), str(r), str(RANKS), str(STEPS)],
                cwd=tmp_path,
                env=worker_env,
            )
            for r in range(RANKS)
        ]
        assert [w.wait(60) for w in workers] == [0] * RANKS
    finally:
        collector.terminate()
        assert collector.wait(30) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(STEPS))
    assert all(not r["partial"] and r["ranks"] == RANKS for r in records), records
    text = log.read_text()
    assert "CurveZMQ on" in text and "secret keys" not in text
    assert "0 handshake failures" in text


def test_collector_warns_about_secret_keys_in_clients_dir(tmp_path) -> None:
    """The old layout (keygen straight into clients_dir) still works, but the collector
    says that the secret key does not belong there."""
    import logging

    from rlpulse.collector.config import CollectorConfig
    from rlpulse.collector.daemon import Collector

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for directory, name in (("server", "collector"), ("clients", "worker")):
        subprocess.run(
            [sys.executable, "-m", "rlpulse.collector", "keygen", str(tmp_path / directory), name],
            env=env,
            check=True,
            capture_output=True,
        )
    config = CollectorConfig(
        bind="tcp://127.0.0.1:*",
        curve={
            "server_cert": str(tmp_path / "server" / "collector.key_secret"),
            "clients_dir": str(tmp_path / "clients"),
        },
    )
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("rlpulse.collector")
    logger.addHandler(handler)
    try:
        Collector(config, sinks={}).close()
    finally:
        logger.removeHandler(handler)
    assert any("worker.key_secret" in r.getMessage() for r in records)


# --- README.md, as a newcomer types it -------------------------------------------------------

SKIPPED = {
    "make demo": "minutes of PPO on Ray; tests/integration/test_demo_check.py checks what it "
    "prints, and make test is how this very test runs",
    "python -m verl.trainer.main_ppo": "needs verl and GPUs; it is docs/integrations.md's "
    "command word for word (test_the_readme_integration_blocks_are_the_tested_ones), which "
    "tests/frameworks/test_verl.py runs",
}
"""A README shell block not run here, by its first line's start: why, and what covers it."""

RUN = {
    "source .venv/bin/activate": "test_activate_then_help",
    "rlpulse collector --config collector.yaml": "test_collector_worker_and_report_as_written",
    "rlpulse report runs/metrics.jsonl": "test_collector_worker_and_report_as_written",
    "pip install '/path/to/rlpulse'": "test_install_lines.py::"
    "test_the_readme_install_keeps_an_existing_environments_torch_and_framework",
}
"""A README shell block run here, by its first line's start: the test that runs it."""


def readme_shell_blocks() -> list[str]:
    return [
        body
        for tag, body in FENCE.findall((ROOT / "README.md").read_text())
        if tag in ("bash", "sh", "shell", "console")
    ]


def commands(block: str) -> list[str]:
    """The block's commands, one per line (continuations joined), comments left out."""
    joined = block.replace("\\\n", " ")
    return [c for line in joined.splitlines() if (c := line.split("#")[0].strip())]


def newcomer_env() -> dict[str, str]:
    """A shell after ``source .venv/bin/activate``: the environment's bin first on PATH."""
    return {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(ROOT),
    }


def test_every_readme_shell_block_is_run_or_skipped() -> None:
    firsts = [commands(block)[0] for block in readme_shell_blocks()]
    unaccounted = [
        first for first in firsts if not any(first.startswith(k) for k in (*RUN, *SKIPPED))
    ]
    assert not unaccounted, f"README shell blocks neither run nor skipped: {unaccounted}"
    stale = [k for k in (*RUN, *SKIPPED) if not any(f.startswith(k) for f in firsts)]
    assert not stale, f"listed but no longer in the README: {stale}"


def test_activate_then_help() -> None:
    """``source .venv/bin/activate`` then ``rlpulse --help``, in the checkout."""
    (block,) = [b for b in readme_shell_blocks() if b.startswith("source .venv/bin/activate")]
    activate = BIN / "activate"
    if not activate.exists():
        pytest.skip(f"{activate}: this environment has no activate script")
    script = "set -e\n" + "\n".join(
        c.replace("source .venv/bin/activate", f"source {activate}") for c in commands(block)
    )
    done = subprocess.run(
        ["bash", "-c", script], cwd=ROOT, env=newcomer_env(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: rlpulse COMMAND")


def readme_table_commands() -> list[str]:
    """The ``rlpulse X`` commands of the README's table of commands."""
    section = doc_section("README.md", "## Installing rlpulse into your own stack")
    return re.findall(r"^\| `rlpulse (\w+)", section, flags=re.M)


def test_every_command_in_the_readme_table_takes_help_and_names_itself() -> None:
    """``rlpulse X --help`` works for every command listed and shows the command a user types
    (they showed ``python -m rlpulse.collector report``, ``python -m rlpulse.trainer``...)."""
    listed = readme_table_commands()
    from rlpulse.cli import COMMANDS

    assert sorted(listed) == sorted(COMMANDS)
    for name in listed:
        done = subprocess.run(
            ["rlpulse", name, "--help"], env=newcomer_env(), capture_output=True, text=True
        )
        assert done.returncode == 0, (name, done.stderr)
        assert done.stdout.startswith(f"usage: rlpulse {name} "), done.stdout[:200]


def wait_for(predicate, what: str, proc: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, f"exited ({proc.returncode}) waiting for {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_collector_worker_and_report_as_written(tmp_path: Path) -> None:
    """In an empty directory: the README's ``collector.yaml``, its collector command, its
    worker saved as ``worker.py`` and run with ``python worker.py``, Ctrl-C, then its report
    command. The steps are all there and the report draws the worker's own name."""
    env = newcomer_env()
    (tmp_path / "collector.yaml").write_text(
        doc_block("README.md", "## Running the collector", "yaml")
    )
    (tmp_path / "worker.py").write_text(
        doc_block("README.md", "## Logging from a worker", "python")
    )
    (collector_cmd,) = commands(doc_block("README.md", "## Running the collector", "bash"))
    (report_cmd,) = commands(doc_block("README.md", "## Logging from a worker", "bash"))
    log = tmp_path / "collector.log"
    collector = subprocess.Popen(  # no shell in between: Ctrl-C reaches the collector
        shlex.split(collector_cmd),
        cwd=tmp_path,
        env=env,
        stderr=log.open("w"),
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: "listening on" in log.read_text(), "the collector", collector)
        assert "tcp://127.0.0.1:5555" in log.read_text()
        worker = subprocess.run(
            "python worker.py",
            shell=True,
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert worker.returncode == 0, worker.stderr
        stats = ast.literal_eval(worker.stdout.strip().splitlines()[-1])  # p.stats()
        assert stats["sent_messages"] > 0
        assert {k: v for k, v in stats.items() if v and k not in ("logged", "sent_messages")} == {}
        # Ctrl-C once the collector has printed the steps, as a user watching it does: a new
        # run's steps wait settle_s (2 s) for other roles, and stopped before that, a
        # collector with state_dir keeps them for its next start (the README says so).
        out = tmp_path / "runs" / "metrics.jsonl"
        wait_for(lambda: out.exists() and len(out.read_text().splitlines()) >= 5, "5", collector)
    finally:
        collector.send_signal(signal.SIGINT)  # Ctrl-C, as the README says
        code = collector.wait(30)
    assert code == 0, log.read_text()
    records = [json.loads(line) for line in (tmp_path / "runs" / "metrics.jsonl").open()]
    assert [r["step"] for r in records] == list(range(5))
    assert all(not r["partial"] and r["run"] == "hello" for r in records)
    assert all(r["metrics"]["my/reward_bonus"] == r["step"] for r in records)

    done = subprocess.run(
        report_cmd, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "runs" / "metrics-report.png").stat().st_size > 0
    assert "1 of the run's own names" in done.stdout


STOP_WORKER = textwrap.dedent(
    """
    import sys, time
    from rlpulse import Producer
    from rlpulse.producer.config import ProducerConfig

    rank, address = int(sys.argv[1]), sys.argv[2]
    p = Producer(address, run="stop", role="actor_train", rank=rank, world_size=2,
                 reductions={"my/calls": "sum"}, config=ProducerConfig(close_timeout_s=60))
    for step in range(20):
        p.log({"my/x": float(step), "my/calls": 1}, step=step)  # my/calls: calls merged
        p.log({"my/y": float(rank), "my/calls": 1}, step=step)
        time.sleep(0.15)
    p.close()  # waits (up to 60 s) for the restarted collector to acknowledge everything
    stats = p.stats()
    sys.exit(0 if stats["unacked"] == stats["dropped_send"] == stats["unconfirmed"] == 0 else 3)
    """
)
STOP_STEPS, STOP_CALLS = 20, 4  # two ranks, two calls each a step


def stopped_midrun(tmp_path: Path, config: str) -> list[dict]:
    """The README's collector config, started as written (``--bind`` to a free port, as the
    README allows), two ranks of a worker logging 20 steps, the collector stopped with Ctrl-C
    once 6 steps are written and started again a second later; the steps written once every
    worker is done and the collector has written step 19 (or 30 s have passed)."""
    from tests.support.net import free_port

    tmp_path.mkdir(parents=True)
    (tmp_path / "collector.yaml").write_text(config)
    (tmp_path / "worker.py").write_text(STOP_WORKER)
    env, address = newcomer_env(), f"tcp://127.0.0.1:{free_port()}"
    out = tmp_path / "runs" / "metrics.jsonl"

    def steps() -> list[dict]:
        return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []

    def start(n: int) -> subprocess.Popen:
        log = tmp_path / f"collector{n}.log"
        proc = subprocess.Popen(
            ["rlpulse", "collector", "--config", "collector.yaml", "--bind", address],
            cwd=tmp_path,
            env=env,
            stderr=log.open("w"),
            stdout=subprocess.DEVNULL,
        )
        wait_for(lambda: "listening on" in log.read_text(), "the collector", proc)
        return proc

    collector = start(1)
    workers = [
        subprocess.Popen([sys.executable, "worker.py", str(r), address], cwd=tmp_path, env=env)
        for r in range(2)
    ]
    try:
        wait_for(lambda: len(steps()) >= 6, "6 steps", collector)
        collector.send_signal(signal.SIGINT)  # Ctrl-C mid-run
        assert collector.wait(30) == 0
        time.sleep(1.0)
        collector = start(2)
        assert [w.wait(90) for w in workers] == [0, 0]  # nothing dropped by the producers
        deadline = time.monotonic() + 30
        while not any(r["step"] == STOP_STEPS - 1 for r in steps()):
            assert time.monotonic() < deadline, steps()
            time.sleep(0.05)
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
        collector.send_signal(signal.SIGINT)
        assert collector.wait(30) == 0
    return steps()


def test_the_readme_collector_keeps_every_step_across_a_ctrl_c_and_without_state_dir_does_not(
    tmp_path: Path,
) -> None:
    """Issue 45, item 4: the README's first config has ``state_dir``, and says what a collector
    without one loses on a stop. Both, shown: with the config as written, Ctrl-C mid-run and a
    restart lose and repeat nothing (every step once, whole, every call merged once); the same
    config without its ``state_dir`` line writes the step open at the stop as partial (and,
    depending on timing, a step twice or calls twice: never the exact run), and flags what
    it cannot vouch for: a step written again after the restart is partial and continued, so
    what is not flagged is exact, once."""
    config = doc_block("README.md", "## Running the collector", "yaml")
    assert re.search(r"^state_dir: ", config, flags=re.M), config
    section = doc_section("README.md", "## Running the collector")
    assert "Without `state_dir`" in section and "partial" in section
    assert '"continued": true' in section and '"resent"' in section

    kept = stopped_midrun(tmp_path / "with", config)
    assert [r["step"] for r in kept] == list(range(STOP_STEPS))  # each once, in order
    assert all(not r["partial"] and r["metrics"]["my/calls"] == STOP_CALLS for r in kept), kept
    assert all(r["metrics"]["my/x"] == r["step"] for r in kept)

    bare = re.sub(r"^state_dir: .*\n", "", config, flags=re.M)
    lost = stopped_midrun(tmp_path / "without", bare)
    assert any(r["partial"] for r in lost), lost  # the step open at the stop, at least
    exact = [r["step"] for r in lost] == list(range(STOP_STEPS)) and all(
        not r["partial"] and r["metrics"].get("my/calls") == STOP_CALLS for r in lost
    )
    assert not exact
    unflagged = [r for r in lost if not r["partial"]]  # what it vouches for: exact, once
    assert all(r["metrics"]["my/calls"] == STOP_CALLS for r in unflagged), lost
    assert len({r["step"] for r in unflagged}) == len(unflagged), lost
    assert all(r["continued"] for r in lost if r["partial"] and not r["missing"]), lost
    # Ctrl-C: its last acknowledgements said what it applied; nothing is in two records.
    assert not any(r.get("resent") for r in lost), lost


def test_the_collector_with_no_config_is_what_the_readme_says(tmp_path: Path) -> None:
    """ "With no config at all, ``rlpulse collector`` listens on tcp://127.0.0.1:5555 and
    prints each step to stdout"."""
    section = doc_section("README.md", "## Running the collector")
    assert "listens on `tcp://127.0.0.1:5555` and prints each\nstep to stdout" in section
    log = tmp_path / "collector.log"
    collector = subprocess.Popen(
        ["rlpulse", "collector"],
        cwd=tmp_path,
        env=newcomer_env(),
        stderr=log.open("w"),
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: "listening on" in log.read_text(), "the collector", collector)
    finally:
        collector.send_signal(signal.SIGINT)
        assert collector.wait(30) == 0
    assert "listening on tcp://127.0.0.1:5555; trackers: stdout" in log.read_text()


def test_the_readme_integration_blocks_are_the_tested_ones() -> None:
    """The README's verl command and TRL callback are docs/integrations.md's, which
    tests/frameworks runs as written."""
    integrations = "docs/integrations.md"
    verl = doc_block("README.md", "## Attaching verl or TRL", "bash")
    trl = doc_block("README.md", "## Attaching verl or TRL", "python")
    assert verl == doc_block(integrations, "### verl", "bash")
    assert trl == doc_block(integrations, "### TRL", "python")


def test_no_benchmark_or_script_writes_the_readme() -> None:
    """Benchmark figures live in benchmarks/RESULTS.md only: nothing under benchmarks/ or
    scripts/ names README.md as a file to write."""
    for path in [*ROOT.joinpath("benchmarks").glob("*.py"), *ROOT.joinpath("scripts").glob("*")]:
        if path.is_file():
            text = path.read_text(errors="replace")
            assert not re.search(r"README\.md\W*\)?\s*\.(write_text|open)", text), path
            assert '"README.md"' not in text and "'README.md'" not in text, path


def test_every_relative_link_of_the_readme_and_docs_resolves() -> None:
    """The README and docs/ link each other and the repository's files: every relative link
    names a file or folder that exists, and every ``#anchor`` a heading of its page."""

    def anchors(page: Path) -> set[str]:
        text = page.read_text()
        found = set()
        for line in re.findall(r"^#{1,6} (.*)$", FENCE.sub("", text), flags=re.M):
            slug = re.sub(r"[^\w\- ]", "", line.strip().lower()).replace(" ", "-")
            found.add(slug)
        return found

    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", FENCE.sub("", page.read_text())):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, broken
