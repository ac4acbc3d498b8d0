"""``python -m collector --config FILE [--bind ADDRESS]``: run the rlpulse collector.
``python -m collector keygen DIR NAME``: make a CurveZMQ key pair."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from collector.config import CollectorConfig
from collector.daemon import Collector, write_ready_file
from collector.errors import ConfigError


def keygen(argv: list[str]) -> int:
    """``python -m collector keygen DIR NAME``: a CurveZMQ key pair for the collector or a
    worker (``NAME.key`` is public: copy it to the other side; ``NAME.key_secret`` is not)."""
    import zmq.auth

    parser = argparse.ArgumentParser(prog="rlpulse-collector keygen", description=keygen.__doc__)
    parser.add_argument("directory")
    parser.add_argument("name")
    args = parser.parse_args(argv)
    Path(args.directory).mkdir(parents=True, exist_ok=True)
    public, secret = zmq.auth.create_certificates(args.directory, args.name)
    Path(secret).chmod(0o600)
    print(f"public key: {public}\nsecret key: {secret} (keep it private)")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["keygen"]:
        return keygen(argv[1:])
    if argv[:1] in (["report"], ["compare"]):
        from collector.runtools.cli import main as run_tools

        return run_tools(argv)
    parser = argparse.ArgumentParser(prog="rlpulse-collector", description=__doc__)
    parser.add_argument("--config", help="YAML config (bind, track_with, tracker_kwargs, ...)")
    parser.add_argument("--bind", help="ZeroMQ endpoint to listen on, overriding the config")
    parser.add_argument("--ready-file", help="write the bound address here once listening")
    args = parser.parse_args(argv)
    try:
        if args.config:
            config = CollectorConfig.load(args.config, bind=args.bind)
        else:
            config = CollectorConfig.from_mapping({"bind": args.bind} if args.bind else {})
    except ConfigError as exc:
        print(f"rlpulse-collector: configuration error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        collector = Collector(config)
    except ConfigError as exc:
        print(f"rlpulse-collector: configuration error: {exc}", file=sys.stderr)
        return 2
    collector.install_signal_handlers()
    if args.ready_file:
        write_ready_file(args.ready_file, collector.address)
    collector.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
