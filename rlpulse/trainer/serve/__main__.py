"""``python -m rlpulse.trainer.serve --model runs/demo/checkpoint-29/actor [--port 8000] [--collector ADDRESS]``

Serves the exported policy over HTTP (``POST /generate``, ``GET /healthz``) with uvicorn, on
127.0.0.1 unless ``--host`` says otherwise. With ``--collector`` (or ``RLPULSE_ADDRESS``) the
server streams its metrics to that collector as role ``serve`` of run ``--run``. A bad option
exits with status 2 and a message naming it.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys

from rlpulse.extras import MissingExtra, needs_extra
from rlpulse.producer import ADDRESS_VAR, NullProducer, Producer
from rlpulse.schemas.errors import ConfigError
from rlpulse.schemas.topology import SERVE
from rlpulse.trainer.serve.config import DEVICES, ServeConfig

DEFAULTS = {f.name: f.default for f in dataclasses.fields(ServeConfig)}


PROG = "python -m rlpulse.trainer.serve"


def parse_args(argv: list[str] | None, prog: str = PROG) -> ServeConfig:
    """The configuration the command line asks for; ConfigError names a bad field."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model", required=True, help="checkpoint directory (runs/<run>/checkpoint-<step>/actor)"
    )
    parser.add_argument(
        "--host", help=f"address to bind (default {DEFAULTS['host']}: this machine only)"
    )
    parser.add_argument("--port", type=int, help=f"port (default {DEFAULTS['port']})")
    parser.add_argument(
        "--device", choices=DEVICES, help="auto (default): the GPU when there is one"
    )
    parser.add_argument(
        "--max-batch-size",
        type=int,
        help=f"requests per model call (default {DEFAULTS['max_batch_size']})",
    )
    parser.add_argument(
        "--batch-wait-ms",
        type=float,
        help="wait for more requests after a batch's first (default 0)",
    )
    parser.add_argument(
        "--max-queue",
        type=int,
        help=f"waiting requests before 503 (default {DEFAULTS['max_queue']})",
    )
    parser.add_argument(
        "--max-new-tokens-limit",
        type=int,
        help=f"largest max_new_tokens accepted (default {DEFAULTS['max_new_tokens_limit']}, capped by the model's context)",
    )
    parser.add_argument(
        "--request-timeout-s",
        type=float,
        help="close a connection that has not sent a whole request within this many seconds "
        f"(default {DEFAULTS['request_timeout_s']:g})",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        help="connections open at once; more are answered 503 and closed "
        f"(default {DEFAULTS['max_connections']})",
    )
    parser.add_argument(
        "--collector",
        help=f"stream metrics to this collector (default: ${ADDRESS_VAR}; none: no metrics)",
    )
    parser.add_argument("--run", help=f"run name of the metrics (default {DEFAULTS['run']})")
    parser.add_argument("--rank", type=int, help="this replica's index (default 0)")
    parser.add_argument(
        "--replicas", type=int, help="replicas reporting to the collector (default 1)"
    )
    parser.add_argument(
        "--report-interval-s",
        type=float,
        help=f"seconds per metrics window (default {DEFAULTS['report_interval_s']})",
    )
    parser.add_argument("--torch-threads", type=int, help="CPU threads for torch")
    args = vars(parser.parse_args(argv))
    if args["collector"] is None and os.environ.get(ADDRESS_VAR):
        args["collector"] = os.environ[ADDRESS_VAR]
    return ServeConfig(**{k: v for k, v in args.items() if v is not None})


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    try:
        config = parse_args(argv, prog)
    except ConfigError as exc:
        print(f"trainer.serve: configuration error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # Heavy imports (torch, transformers, uvicorn) only once the arguments are known good.
    try:
        with needs_extra("serve", "rlpulse serve"):
            import torch
            import uvicorn

            from rlpulse.trainer.serve.app import Server, create_app
            from rlpulse.trainer.serve.deadline import RequestDeadlineProtocol
            from rlpulse.trainer.serve.engine import Engine
            from rlpulse.trainer.serve.telemetry import MetricsProducer
    except MissingExtra as exc:
        print(f"trainer.serve: {exc}", file=sys.stderr)
        return 2

    if config.torch_threads is not None:
        torch.set_num_threads(config.torch_threads)
    try:
        engine = Engine.load(config.model, config.device)
    except ConfigError as exc:
        print(f"trainer.serve: configuration error: {exc}", file=sys.stderr)
        return 2
    producer: MetricsProducer
    if config.collector:
        producer = Producer(
            config.collector,
            run=config.run,
            role=SERVE,
            rank=config.rank,
            world_size=config.replicas,
        )
    else:
        producer = NullProducer(run=config.run, role=SERVE)
    server = Server(config, engine, producer)
    logging.getLogger("rlpulse.serve").info(
        "serving %s on %s (context %d tokens) at http://%s:%d; metrics %s",
        config.model,
        engine.device,
        engine.context,
        config.host,
        config.port,
        f"to {config.collector} as run {config.run!r}, role {SERVE}" if config.collector else "off",
    )
    # uvicorn turns SIGTERM and SIGINT into a graceful shutdown (requests in flight answered,
    # then the lifespan closes the server: the last metrics window is reported), restores
    # the handlers it found and raises the signal again. Found handlers that do nothing make
    # that a clean exit 0 instead of a death by signal.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    # h11 with a deadline per request, whatever HTTP implementation uvicorn would pick.
    uvicorn.run(
        create_app(server),
        host=config.host,
        port=config.port,
        log_level="warning",
        http=RequestDeadlineProtocol.with_timeout(
            config.request_timeout_s, config.max_connections, server.refused
        ),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
