"""TRL's vLLM server mode: the server's own metrics per training step.

With ``use_vllm=True, vllm_mode="server"``, only TRL's main process talks to the vLLM server
(``trl vllm-serve``, which runs vLLM's own server, or ``vllm serve``): it gathers every
process's prompts, sends them, and hands the completions back. So :func:`attach` wraps the main
process's ``trainer._generate`` (on the instance) in an
:class:`~rlpulse.producer.enginewatch.EngineWatch` window at the step being computed
(``global_step + 1``, as the loss and samples hooks log): the server's counters and histogram
buckets change over the call, its gauges peak during it (``rollout/engine/...``, the names the
in-process path logs). The server is the one TRL connects to: ``vllm_server_base_url``, else
``http://{vllm_server_host}:{vllm_server_port}``, with ``/metrics``; ``RLPULSE_ENGINES`` adds
others. Evaluation generations call ``_generate`` too: they count in the step they run in.

>>> from types import SimpleNamespace as Args
>>> server_url(Args(use_vllm=True, vllm_mode="server", vllm_server_base_url=None,
...                 vllm_server_host="10.0.0.7", vllm_server_port=8000))
'http://10.0.0.7:8000/metrics'
>>> server_url(Args(use_vllm=True, vllm_mode="colocate")) is None
True
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from rlpulse.producer.enginewatch import EngineWatch, Logs

log = logging.getLogger("rlpulse.integrations.trl")


def server_url(args: Any) -> str | None:
    """The ``/metrics`` URL of the vLLM server TRL generates with (``args``: its
    ``GRPOConfig``/``RLOOConfig``), None unless it runs in server mode."""
    if not getattr(args, "use_vllm", False) or getattr(args, "vllm_mode", None) != "server":
        return None
    base = getattr(args, "vllm_server_base_url", None)
    if base:
        return f"{str(base).rstrip('/')}/metrics"
    host = str(args.vllm_server_host)
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{args.vllm_server_port}/metrics"


def attach(trainer: Any, producer: Logs) -> Callable[[], None] | None:
    """On the main process of a trainer generating through a vLLM server (or with
    ``RLPULSE_ENGINES`` set), wrap its ``_generate`` in an engine window; the function that
    undoes it and stops the watch, or None when there is nothing to watch. A bad URL raises
    ConfigError (the run stops at start, naming it)."""
    if not getattr(trainer.accelerator, "is_main_process", True):
        return None
    original = getattr(trainer, "_generate", None)
    if not callable(original):
        return None
    url = server_url(trainer.args)
    watch = EngineWatch(producer, [url] if url else [])
    if not watch.urls:
        watch.close()
        return None

    @functools.wraps(original)
    def generate(*args: Any, **kwargs: Any) -> Any:
        step = trainer.state.global_step + 1  # the optimizer step being computed
        with watch.window(step):
            return original(*args, **kwargs)

    trainer._generate = generate
    log.info("rlpulse: engine metrics per step from %s", ", ".join(watch.urls))

    def detach() -> None:
        trainer.__dict__.pop("_generate", None)
        watch.close()

    return detach
