"""Serve an exported policy over HTTP and stream the server's metrics to a collector.

``python -m rlpulse.trainer.serve --model runs/demo/checkpoint-29/actor --port 8000``: FastAPI and
uvicorn (the ``serve`` extra), ``POST /generate`` and ``GET /healthz``. The parts, each in its
module: the configuration (``config``), request checks (``requests``), the model
(``engine``), dynamic batching (``batcher``), the server's metrics (``telemetry``) and the
HTTP app (``app``). Nothing heavy is imported with the package.
"""
