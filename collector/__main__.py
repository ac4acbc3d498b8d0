"""``python -m collector --config FILE [--bind ADDRESS]``: run the rlpulse collector."""

from __future__ import annotations

import argparse
import logging
import sys

from collector.config import CollectorConfig
from collector.daemon import Collector, write_ready_file
from collector.errors import ConfigError


def main(argv: list[str] | None = None) -> int:
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
