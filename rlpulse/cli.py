"""The ``rlpulse`` command: one entry point for every tool.

commands:
  rlpulse collector --config FILE [--bind ADDRESS]   run the collector daemon
  rlpulse report RUN.jsonl [...]                     a PNG of one run's main curves
  rlpulse compare A.jsonl B.jsonl [...]              a table comparing runs side by side
  rlpulse samples RUN.jsonl [--step N] [...]         a run's sample rows (prompt, response...)
  rlpulse why RUN.jsonl [--step N]                   where a step's time went, against the median
  rlpulse register --url URL --run R --role ROLE ... keep a /metrics endpoint registered
  rlpulse keygen DIR NAME [--force]                  make a CurveZMQ key pair
  rlpulse serve --model DIR [...]                    serve a trained policy over HTTP
  rlpulse train [--config FILE] [...]                the demo PPO/GRPO trainer on Ray
  rlpulse deploy export DIR                          write the Prometheus, Grafana and compose files

Each command takes ``--help``. Exit status: 0 on success, 2 for a bad configuration or
usage (the message names the field), as each tool documents.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

USAGE = __doc__.split("\n\n")[1]
PROG = "rlpulse"
"""The command's name, as every tool's ``--help`` and messages show it: what a user types."""


def _collector(argv: list[str]) -> int:
    from rlpulse.collector.__main__ import main

    return main(argv, prog=f"{PROG} collector")


def _keygen(argv: list[str]) -> int:
    from rlpulse.collector.__main__ import keygen

    return keygen(argv, prog=f"{PROG} keygen")


def _register(argv: list[str]) -> int:
    from rlpulse.producer.register import main

    return main(argv)


def _run_tool(name: str) -> Callable[[list[str]], int]:
    """``report``, ``compare``, ``samples`` and ``why``: the run tools over a run's jsonl."""

    def run(argv: list[str]) -> int:
        from rlpulse.runtools.cli import main

        return main([name, *argv], prog=PROG)

    return run


def _serve(argv: list[str]) -> int:
    from rlpulse.trainer.serve.__main__ import main

    return main(argv, prog=f"{PROG} serve")


def _train(argv: list[str]) -> int:
    from rlpulse.trainer.__main__ import main

    return main(argv, prog=f"{PROG} train")


def _deploy(argv: list[str]) -> int:
    from rlpulse.deploy.export import main

    return main(argv)


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "collector": _collector,
    "report": _run_tool("report"),
    "compare": _run_tool("compare"),
    "samples": _run_tool("samples"),
    "why": _run_tool("why"),
    "register": _register,
    "keygen": _keygen,
    "serve": _serve,
    "train": _train,
    "deploy": _deploy,
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(f"usage: {PROG} COMMAND [ARGS]\n\n{USAGE}", file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    command = COMMANDS.get(argv[0])
    if command is None:
        print(
            f"{PROG}: unknown command {argv[0]!r}; commands: {', '.join(COMMANDS)} ({PROG} --help)",
            file=sys.stderr,
        )
        return 2
    return command(argv[1:])
