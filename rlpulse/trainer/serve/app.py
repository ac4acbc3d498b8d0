"""The HTTP API: ``POST /generate`` and ``GET /healthz`` (FastAPI, run by uvicorn).

``/generate`` takes ``{"prompt": str, "max_new_tokens": int, "temperature": number}`` and
answers ``{"response": str, "tokens": int, "finish_reason": "eos" | "length"}``; a bad request
gets a 4xx (an overloaded or failing server a 5xx) with ``{"error": kind, "field": ...,
"message": ...}``, the kind being the catalog's (``rlpulse.schemas.serving.ERROR_KINDS``). Nothing a
client sends can stop the server: every failure of a request is answered and counted.

``/healthz`` answers 200 with the model, device, queue depth and counts while the generation
thread runs, 503 when it does not.

A client that disconnects before its body has arrived (or is disconnected for sending it too
slowly, ``ServeConfig.request_timeout_s``) is no request: it is logged, not answered, and not
counted among the answers or errors.

>>> # app = create_app(Server(config, engine, producer)); uvicorn.run(app, ...)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect

from rlpulse.schemas import serving as S
from rlpulse.trainer.serve.batcher import Batcher
from rlpulse.trainer.serve.config import ServeConfig
from rlpulse.trainer.serve.engine import Engine, Job
from rlpulse.trainer.serve.requests import Limits, RequestError, error_body, parse_request
from rlpulse.trainer.serve.telemetry import MetricsProducer, Reporter, ServeMetrics

log = logging.getLogger("rlpulse.serve")


class Server:
    """The parts behind the API, wired from a config: engine, batcher, metrics, reporter.

    ``start()`` and ``close()`` are idempotent; the app's lifespan calls them.
    """

    def __init__(self, config: ServeConfig, engine: Engine, producer: MetricsProducer) -> None:
        self.config = config
        self.engine = engine
        self.metrics = ServeMetrics()
        self.reporter = Reporter(
            self.metrics,
            producer,
            interval_s=config.report_interval_s,
            depth=lambda: self.batcher.depth(),
        )
        self.batcher = Batcher(
            engine,
            self.reporter,
            max_batch_size=config.max_batch_size,
            max_queue=config.max_queue,
            batch_wait_s=config.batch_wait_ms / 1000,
        )
        self.limits = Limits(
            max_new_tokens=min(config.max_new_tokens_limit, engine.context - 1),
            max_temperature=config.max_temperature,
            default_max_new_tokens=min(config.default_max_new_tokens, engine.context - 1),
            default_temperature=config.default_temperature,
        )

    def start(self) -> None:
        self.batcher.start()
        self.reporter.start()

    def close(self) -> None:
        self.batcher.close()
        self.reporter.close()

    async def read_body(self, request: Request) -> bytes:
        """The body, refused (413) past ``max_body_bytes`` without reading the rest."""
        limit = self.config.max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise RequestError(
                S.BODY_TOO_LARGE, f"the body is {declared} bytes; at most {limit} are accepted"
            )
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise RequestError(
                    S.BODY_TOO_LARGE,
                    f"the body is over {limit} bytes; at most {limit} are accepted",
                )
        return bytes(body)

    def job(self, body: bytes) -> Job:
        """A checked, tokenized job for ``body``; RequestError names what is wrong."""
        request = parse_request(body, self.limits)
        tokens = len(self.engine.encode(request.prompt))
        if tokens == 0:
            raise RequestError(
                S.EMPTY_PROMPT, "prompt has no tokens once tokenized", field="prompt"
            )
        context = self.engine.context
        if tokens + request.max_new_tokens > context:
            raise RequestError(
                S.PROMPT_TOO_LONG,
                f"prompt is {tokens} tokens and max_new_tokens {request.max_new_tokens}: "
                f"{tokens + request.max_new_tokens} do not fit the model's context of {context} "
                "tokens; shorten the prompt or lower max_new_tokens",
                field="prompt",
            )
        return Job(request, tokens)

    async def generate(self, request: Request) -> Response:
        start = time.perf_counter()
        tokens, kind = 0, None
        try:
            job = self.job(await self.read_body(request))
            answer = await asyncio.wrap_future(self.batcher.submit(job))
            tokens = answer.tokens
            response = JSONResponse(
                {
                    "response": answer.text,
                    "tokens": answer.tokens,
                    "finish_reason": answer.finish_reason,
                }
            )
        except ClientDisconnect:  # from read_body: the connection is gone
            client = f"{request.client.host}:{request.client.port}" if request.client else "?"
            log.info("serve: client %s went away before its request body arrived", client)
            return Response(status_code=400)  # sent nowhere: uvicorn drops it
        except RequestError as exc:
            kind = exc.kind
            response = JSONResponse(error_body(exc), status_code=exc.status)
        except Exception as exc:  # anything else is the server's fault, answered all the same
            log.exception("serve: /generate failed")
            error = RequestError(S.INTERNAL, f"the server failed: {type(exc).__name__}")
            kind = error.kind
            response = JSONResponse(error_body(error), status_code=error.status)
        self.metrics.answered(time.perf_counter() - start, error=kind, tokens=tokens)
        return response

    def refused(self) -> None:
        """A connection refused over ``max_connections`` (``deadline``): answered 503 at
        once, counted as an ``overloaded`` answer."""
        self.metrics.answered(0.0, error=S.OVERLOADED)

    def health(self) -> tuple[int, dict[str, Any]]:
        alive = self.batcher.alive()
        return (200 if alive else 503), {
            "status": "ok" if alive else "generation thread stopped",
            "model": self.config.model,
            "device": str(self.engine.device),
            "context": self.engine.context,
            "max_new_tokens": self.limits.max_new_tokens,
            "queue_depth": self.batcher.depth(),
            "batches": self.batcher.batches,
            "window": self.reporter.window,
            "answered": dict(self.metrics.totals),
        }


def create_app(server: Server) -> FastAPI:
    """The FastAPI app around ``server``; its lifespan starts and closes the server."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        server.start()
        try:
            yield
        finally:
            server.close()

    app = FastAPI(title="rlpulse policy server", lifespan=lifespan)

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        """Generate a response for one prompt (see the module docstring for the JSON)."""
        return await server.generate(request)

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        status, body = server.health()
        return JSONResponse(body, status_code=status)

    return app
