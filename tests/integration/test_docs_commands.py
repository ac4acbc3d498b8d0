"""The commands the documentation names exist (issue 45, item 8): every ``rlpulse X``,
``python -m rlpulse...`` and ``collector X`` that a page, an example, a deploy file or a
docstring shows a user as a command. The exported ``prometheus.yml`` named ``python -m
rlpulse.collector register``, docs/integrations.md ``collector compare``, the Dockerfile
``python -m rlpulse.collector report``: none of them runs.

Where commands are looked for: the shell blocks and inline code of every Markdown page
(README, docs/, examples/, rlpulse/), inline code and ``python -m`` lines in the comments of
the examples' and deploy/'s files, the non-comment lines of their shell scripts and
Dockerfiles, and the ``double-backquoted`` code of rlpulse's Python docstrings and comments.
``rlpulse X`` must be one of ``rlpulse``'s commands; every other form is run with ``--help``
and must exit 0 with a usage line naming its word (argparse answers ``--help`` before it
refuses a word it does not know).

It also keeps the shell blocks of docs/integrations.md, docs/operating.md and the examples'
READMEs each run by a test or listed as skipped with the reason, as the README's are
(tests/integration/test_readme_commands.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.docs import FENCE, ROOT

BIN = Path(sys.executable).parent
SHELL = ("bash", "sh", "shell", "console")
COMMAND = re.compile(
    r"(?<![\w./-])(?<!from )(?<!import )"
    r"(python -m rlpulse(?:\.\w+)*|rlpulse|collector)( [a-z][\w-]*)?(?![\w.-])"
)
"""A command and its first word: ``rlpulse report``, ``python -m rlpulse.collector keygen``,
``collector compare`` (a command given to the wrong tool)."""


def _shell_lines(code: str) -> list[str]:
    """A shell script's commands, one per line (continuations joined), comments left out."""
    lines = code.replace("\\\n", " ").splitlines()
    return [line.split(" #")[0] for line in lines if not line.lstrip().startswith("#")]


def code_spans(path: Path) -> Iterator[str]:
    """Where ``path`` shows commands (see the module docstring), whitespace folded."""
    text = path.read_text(errors="replace")
    if path.suffix == ".md":
        spans = [
            line for tag, body in FENCE.findall(text) if tag in SHELL for line in _shell_lines(body)
        ]
        spans += re.findall(r"`([^`]+)`", FENCE.sub("", text))
    elif path.suffix == ".py":
        spans = re.findall(r"``([^`]+)``", text)
    else:
        lines = text.splitlines()
        comments = "\n".join(line.partition("#")[2] for line in lines if "#" in line)
        spans = re.findall(r"`([^`]+)`", comments)
        spans += re.findall(r"python -m rlpulse\S*(?: [a-z][\w-]*)?", comments)
        if path.suffix == ".sh" or path.name == "Dockerfile":
            spans += _shell_lines(text)
    for span in spans:  # .venv/bin/rlpulse X is rlpulse X, .venv/bin/python -m, python -m
        yield re.sub(r"\S*/bin/(rlpulse|python)\b", r"\1", " ".join(span.split()))


def documented_files() -> list[Path]:
    pages = [ROOT / "README.md", *ROOT.joinpath("docs").glob("*.md")]
    pages += ROOT.joinpath("rlpulse").rglob("*.md")
    pages += (p for p in ROOT.joinpath("examples").rglob("*") if p.is_file())
    deploy = ROOT / "rlpulse" / "deploy"
    pages += (
        p
        for p in deploy.rglob("*")
        if p.is_file()
        and (p.suffix in (".yml", ".yaml", ".sh", ".service") or p.name == "Dockerfile")
    )
    pages += ROOT.joinpath("rlpulse").rglob("*.py")
    return sorted(set(pages))


def named_commands() -> dict[tuple[str, str], set[str]]:
    """(command, first word or "") -> the files that name it."""
    found: dict[tuple[str, str], set[str]] = {}
    for path in documented_files():
        for span in code_spans(path):
            for m in COMMAND.finditer(span):
                key = (m.group(1), (m.group(2) or "").strip())
                found.setdefault(key, set()).add(str(path.relative_to(ROOT)))
    return found


def argv(command: str, word: str) -> list[str] | None:
    """How to ask ``command word`` for its help; None where nothing needs running."""
    if command.startswith("python -m "):
        return [sys.executable, *command.split()[1:], *([word] if word else []), "--help"]
    if command == "collector":  # "collector compare": only the commands rlpulse has
        from rlpulse.cli import COMMANDS

        return [str(BIN / "rlpulse"), "collector", word, "--help"] if word in COMMANDS else None
    return None  # rlpulse X: checked against rlpulse's commands


def test_every_rlpulse_command_named_is_one() -> None:
    from rlpulse.cli import COMMANDS

    wrong = {
        f"rlpulse {word}": sorted(files)
        for (command, word), files in named_commands().items()
        if command == "rlpulse" and word and word not in COMMANDS
    }
    assert not wrong, f"commands rlpulse does not have: {wrong}"


def test_every_other_command_named_takes_help() -> None:
    """``python -m rlpulse.collector keygen --help`` exits 0 with keygen's usage. ``python -m
    rlpulse.collector register --help`` exited 0 too, but with the daemon's usage: argparse
    answers --help before it refuses ``register``, so the usage line must name the word."""
    runs = {
        key: (args, files)
        for key, files in named_commands().items()
        if (args := argv(*key)) is not None
    }
    assert any(key[0] == "python -m rlpulse.collector" for key in runs)  # the scan finds them
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = {
        key: subprocess.Popen(
            args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for key, (args, _) in runs.items()
    }
    failed = {}
    for (command, word), proc in started.items():
        out, err = proc.communicate(timeout=120)
        usage = (out.splitlines() or [""])[0]
        if proc.returncode != 0 or not re.match(rf"usage: .*\b{word}\b", usage):
            name = f"{command} {word}".strip()
            failed[name] = (sorted(runs[command, word][1]), usage, err.strip()[-300:])
    assert not failed, f"named commands that do not exist or fail: {failed}"


# --- every shell block of these pages is run by a test, or skipped saying why ----------------

PAGES = (
    "docs/integrations.md",
    "docs/operating.md",
    "examples/verl/README.md",
    "examples/trl/README.md",
)
RUN = "run by "
BLOCKS = {
    ("docs/integrations.md", "env_vars.RLPULSE_ADDRESS=tcp://collector-host:5555"): RUN
    + "tests/frameworks/test_verl.py (its overrides, through verl's config and run_ppo on Ray)",
    ("docs/integrations.md", "rlpulse keygen keys/server collector"): RUN
    + "tests/frameworks/test_verl_nodes.py",
    ("docs/integrations.md", "env_vars.RLPULSE_CURVE_CLIENT_CERT="): RUN
    + "tests/frameworks/test_verl_nodes.py (its overrides, through verl's config and run_ppo)",
    ("docs/integrations.md", "examples/trl/grpo.py --run-name grpo-tiny"): RUN
    + "tests/frameworks/test_trl.py::test_the_readme_commands_run_as_written",
    ("docs/operating.md", "pip wheel --no-deps -w dist ."): "skipped: the [trackers] extra needs "
    "a registry; test_installed_wheel.py builds the wheel and installs it from the wheelhouse",
    ("docs/operating.md", "rlpulse deploy export monitoring"): "skipped: fixed ports and a "
    "prometheus on PATH; test_export_prometheus.py runs the export, a collector and prometheus",
    ("docs/operating.md", "-- vllm serve Qwen/Qwen2.5-7B-Instruct"): "skipped: a 7B model and a "
    "CUDA build of vLLM; the CPU build's form, the next block, is run",
    ("docs/operating.md", "vllm.entrypoints.openai.api_server"): RUN
    + "tests/integration/test_vllm_server.py",
    ("docs/operating.md", "rlpulse report runs/demo/metrics.jsonl"): "skipped: needs make "
    "demo's run and a second trainer run (minutes); tests/runtools runs report and compare",
    ("examples/verl/README.md", "examples/verl/run_ppo.sh"): RUN
    + "tests/frameworks/test_verl_example.py (a stand-in for run_ppo.sh, which needs GPUs)",
    ("examples/trl/README.md", "rlpulse compare runs/grpo-tiny/metrics.jsonl"): "skipped: its "
    "first three lines are docs/integrations.md's TRL block (test_trl.py runs them, and "
    "test_the_trl_example_starts_with_the_tested_commands checks they are)",
}
"""A shell block of ``PAGES``, by a line it holds: the test that runs it, or why none does."""


def shell_blocks(page: str) -> list[str]:
    return [body for tag, body in FENCE.findall((ROOT / page).read_text()) if tag in SHELL]


def test_every_shell_block_of_these_pages_is_run_or_skipped() -> None:
    unclaimed, stale = [], []
    for page in PAGES:
        blocks = shell_blocks(page)
        for block in blocks:
            claims = [text for (p, text) in BLOCKS if p == page and text in block]
            if len(claims) != 1:
                unclaimed.append((page, block.strip().splitlines()[0], claims))
        for p, text in BLOCKS:
            if p == page and sum(text in block for block in blocks) != 1:
                stale.append((page, text))
    assert not unclaimed, f"shell blocks neither run nor skipped (or claimed twice): {unclaimed}"
    assert not stale, f"listed, but in no block (or in several) of its page: {stale}"


def test_the_trl_example_starts_with_the_tested_commands() -> None:
    (example,) = shell_blocks("examples/trl/README.md")
    tested = [b for b in shell_blocks("docs/integrations.md") if "examples/trl/grpo.py" in b]
    assert example.startswith(tested[0])
