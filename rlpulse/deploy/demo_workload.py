"""The `make demo-synthetic` workload, pointed at a collector that is already running (the
compose one).

    RLPULSE_ADDRESS=tcp://127.0.0.1:5555 .venv/bin/python deploy/demo_workload.py --steps 600

``scripts/demo_synthetic.py`` starts its own collector on loopback; this runs the same four
producer processes (two actor_train ranks, a critic, a driver) against ``RLPULSE_ADDRESS``
instead, so the steps reach the compose collector, Prometheus and Grafana. Every role keeps
to one schedule (a step every ``STEP_S`` seconds), so no step waits on a role that fell
behind and none is emitted partial.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path

from rlpulse.producer.env import default_address

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))  # the checkout's
from demo_synthetic import ROLES, START_S, STEP_S, worker  # spawned children inherit sys.path


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=600, help=f"{STEP_S} s each")
    parser.add_argument("--run", default="demo-synthetic")
    parser.add_argument(
        "--driver-delay",
        type=float,
        default=2.0,
        help="seconds between starting the workers and the driver",
    )
    parser.add_argument(
        "--address",
        default=default_address(),
        help="collector address (default: $RLPULSE_ADDRESS or tcp://127.0.0.1:5555)",
    )
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    # The driver starts last, as in the trainer; the producers declare the run's roles, so
    # the collector waits for it. Step 0 begins once it has had time to start.
    epoch = time.time() + args.driver_delay + START_S
    procs = [
        ctx.Process(
            target=worker, args=(args.address, args.run, role, rank, ws, args.steps, i, epoch)
        )
        for i, (role, rank, ws) in enumerate(ROLES)
    ]
    print(f"{len(procs)} producers, {args.steps} steps of run {args.run!r} -> {args.address}")
    for proc in procs[:-1]:
        proc.start()
    time.sleep(args.driver_delay)
    procs[-1].start()
    for proc in procs:
        proc.join()
    return max(p.exitcode or 0 for p in procs)


if __name__ == "__main__":
    sys.exit(main())
