"""``rlpulse register``: keep a process's Prometheus endpoint registered with the
collector, for an engine you start from a shell (``vllm serve``) rather than from Python.

It holds a :class:`~rlpulse.producer.client.Producer` made with ``metrics_url`` and ``logs=False``
(no rank of the run: the collector never waits for it) while a command runs, or until it gets
SIGTERM or SIGINT; the collector then lists the endpoint at ``/sd`` for Prometheus, labelled
with the run, role and rank given here::

    rlpulse register --collector tcp://10.0.0.5:5555 --run grpo-7b \\
        --role rollout --rank 0 --world-size 4 --url http://10.0.0.7:8000/metrics \\
        -- vllm serve Qwen/Qwen2.5-7B-Instruct --port 8000

The command runs in a session of its own, so a Ctrl-C reaches it once, passed on by this
process, as SIGTERM is; the exit status is the command's. A bad argument (a URL that is not
``http(s)://host[:port]/path``) exits with status 2, before anything starts.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
from collections.abc import Callable

from rlpulse.producer.client import Producer

PROG = "rlpulse register"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        usage=f"{PROG} --url URL --run RUN --role ROLE [--rank N] [--world-size N] "
        "[--collector ADDRESS] [-- COMMAND [ARGS...]]",
        description="Keep a /metrics endpoint registered with the collector while COMMAND "
        "runs (without one: until SIGTERM or SIGINT), for Prometheus to discover at the "
        "collector's /sd.",
    )
    parser.add_argument("--url", required=True, help="the endpoint, http(s)://host[:port]/path")
    parser.add_argument("--run", required=True, help="the run it belongs to (label run)")
    parser.add_argument("--role", required=True, help="its role, e.g. rollout (label role)")
    parser.add_argument("--rank", type=int, default=0, help="its rank in the role (label rank)")
    parser.add_argument("--world-size", type=int, default=1, help="ranks of the role")
    parser.add_argument(
        "--collector",
        help="the collector's address (default: $RLPULSE_ADDRESS, else tcp://127.0.0.1:5555)",
    )
    return parser


def main(argv: list[str], make: Callable[..., Producer] = Producer) -> int:
    """Run the command line ``argv`` (without the ``register`` word); ``make`` builds the
    producer (tests pass one that records)."""
    split = argv.index("--") if "--" in argv else len(argv)
    args, command = _parser().parse_args(argv[:split]), argv[split + 1 :]
    try:
        producer = make(
            args.collector,
            run=args.run,
            role=args.role,
            rank=args.rank,
            world_size=args.world_size,
            metrics_url=args.url,
            logs=False,
        )
    except ValueError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    try:
        return _hold(command)
    finally:
        producer.close()


def _hold(command: list[str]) -> int:
    """Run ``command`` to its end, passing SIGTERM and SIGINT on; without one, wait for either."""
    stop = threading.Event()
    child: subprocess.Popen | None = None

    def on_signal(signum: int, _frame: object) -> None:
        if child is not None and child.poll() is None:
            child.send_signal(signum)
        else:
            stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        if not command:
            while not stop.wait(1.0):
                pass
            return 0
        try:
            child = subprocess.Popen(command, start_new_session=True)
        except OSError as exc:
            print(f"{PROG}: cannot run {command[0]!r}: {exc.strerror or exc}", file=sys.stderr)
            return 127
        code = child.wait()
        return 128 - code if code < 0 else code  # killed by signal N: 128 + N, as a shell says
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
