"""``python -m rlpulse.trainer --config FILE [--steps N] [--run NAME] [--resume] [--collector ADDRESS] [--set k=v]``

Without ``--collector`` the trainer starts its own collector (configured by the ``collector``
section of the config; by default a jsonl file in the run directory). A ``--run`` whose
directory already holds an earlier run starts a new attempt, ``NAME-2`` (said on the first
line of output); ``--resume`` writes into the existing one instead.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from rlpulse.extras import MissingExtra, needs_extra
from rlpulse.producer.env import RESUME_VAR
from rlpulse.trainer.config import ConfigError, load_config


def main(argv: list[str] | None = None, prog: str = "python -m rlpulse.trainer") -> int:
    """``prog``: the command as the user typed it (``rlpulse train`` from ``rlpulse``)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", help="YAML config (see trainer/configs/reverse.yaml)")
    parser.add_argument("--steps", type=int, help="number of PPO steps")
    parser.add_argument("--run", help="run name (metrics and checkpoints go under it)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="add to the existing run of this name (its directory and metrics.jsonl) instead "
        "of starting a new attempt NAME-2",
    )
    parser.add_argument("--collector", help="attach to a running collector, e.g. tcp://host:5555")
    parser.add_argument("--ray-address", help="attach to a Ray cluster (auto or HOST:6379)")
    parser.add_argument("--output-dir", help="where run directories go")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any config field, e.g. --set ppo.clip_high=0.3",
    )
    args = parser.parse_args(argv)
    overrides = list(args.set)
    for key, value in (
        ("steps", args.steps),
        ("run", args.run),
        ("collector_address", args.collector),
        ("output_dir", args.output_dir),
        ("cluster.ray_address", args.ray_address),
    ):
        if value is not None:
            overrides.append(f"{key}={value}")
    if args.no_progress:
        overrides.append("progress=false")
    try:
        cfg = load_config(args.config, overrides)
    except ConfigError as exc:
        print(f"trainer: configuration error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        with needs_extra("trainer", "rlpulse train"):
            from rlpulse.trainer.driver import RolloutLost
            from rlpulse.trainer.rollout_vllm import EngineError
            from rlpulse.trainer.run import claim_run, train
            from rlpulse.trainer.workers.rollout import check_backend
    except MissingExtra as exc:
        print(f"trainer: {exc}", file=sys.stderr)
        return 2
    try:  # before the run's directory exists and Ray starts: a refusal leaves nothing behind
        check_backend(cfg)
    except ConfigError as exc:
        print(f"trainer: configuration error: {exc}", file=sys.stderr)
        return 2

    claimed = claim_run(cfg, resume=args.resume)
    cfg = claimed.cfg
    if claimed.notice() is not None:
        print(f"trainer: {claimed.notice()}", flush=True)
    if args.resume:  # producers continue the run on a collector that saw it end
        os.environ[RESUME_VAR] = "1"
    try:
        result = train(cfg)
    except (RolloutLost, EngineError) as exc:  # the rollout engine: failed or gone
        print(f"trainer: {exc}", file=sys.stderr)
        return 1
    val = ", ".join(f"step {s}: {v:.3f}" for s, v in result.val_scores)
    print(
        f"run {cfg.run}: {result.steps} steps; val/score/mean {val}; "
        f"policy exported to {result.export_dir}"
    )
    print(f"producer problems: {result.producer_problems or 'none'}")
    if result.step_seconds:
        ordered = sorted(result.step_seconds)
        print(f"step seconds: median {ordered[len(ordered) // 2]:.3f} over {len(ordered)} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
