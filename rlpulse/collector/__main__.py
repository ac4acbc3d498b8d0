"""The rlpulse collector daemon (``rlpulse collector``), and its key maker.

commands:
  python -m rlpulse.collector --config FILE [--bind ADDRESS]   run the collector daemon
  python -m rlpulse.collector keygen DIR NAME [--force]        make a CurveZMQ key pair

The run tools and endpoint registration are commands of ``rlpulse`` (``rlpulse report``,
``rlpulse compare``, ``rlpulse register``: ``rlpulse.cli``), which sits above the collector and
the producer. A bad configuration exits with status 2 and a message naming the field.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.daemon import Collector, write_ready_file
from rlpulse.collector.intake.receiver import return_large_buffers
from rlpulse.schemas.errors import ConfigError

PROG = "python -m rlpulse.collector"


def keygen(argv: list[str], prog: str = f"{PROG} keygen") -> int:
    """``python -m rlpulse.collector keygen DIR NAME``: a CurveZMQ key pair for the collector or a
    worker (``NAME.key`` is public: copy it to the other side; ``NAME.key_secret`` is not).
    Existing keys are never replaced unless ``--force`` is given."""
    import zmq.auth

    parser = argparse.ArgumentParser(prog=prog, description=keygen.__doc__)
    parser.add_argument("directory")
    parser.add_argument("name")
    parser.add_argument(
        "--force", action="store_true", help="replace an existing key pair of that name"
    )
    args = parser.parse_args(argv)
    directory = Path(args.directory)
    existing = [
        p
        for p in (directory / f"{args.name}.key", directory / f"{args.name}.key_secret")
        if p.exists()
    ]
    if existing and not args.force:
        print(
            f"{prog}: {', '.join(map(str, existing))} already exists; refusing to "
            "overwrite a key pair that clients or the collector may be using "
            "(pass --force to replace it)",
            file=sys.stderr,
        )
        return 2
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"{prog}: cannot create {directory}: {exc.strerror}", file=sys.stderr)
        return 2
    public, secret = zmq.auth.create_certificates(str(directory), args.name)
    Path(secret).chmod(0o600)
    print(f"public key: {public}\nsecret key: {secret} (keep it private)")
    return 0


def _config_error(exc: ConfigError) -> int:
    print(f"rlpulse-collector: configuration error: {exc}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """``prog``: the command as the user typed it (``rlpulse collector`` from the ``rlpulse``
    command), for ``--help`` and messages."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["keygen"]:
        return keygen(argv[1:])
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
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
        return _config_error(exc)
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    return_large_buffers()  # bursts of large messages must not stay in the heap for good
    try:
        # Some problems show only when a port is bound or a file opened (a port in use, a
        # certificate that does not load): those raise ConfigError here, naming the field.
        collector = Collector(config)
    except ConfigError as exc:
        return _config_error(exc)
    collector.install_signal_handlers()
    if args.ready_file:
        write_ready_file(args.ready_file, collector.address)
    collector.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
