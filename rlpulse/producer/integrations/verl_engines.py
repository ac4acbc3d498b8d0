"""verl: its rollout servers' own metrics per training step.

verl 0.9 generates through vLLM (or SGLang) servers it starts itself: ``LLMServerManager``
launches the replicas, each with an HTTP server whose address (``host:port``) it keeps in
``server_addresses`` (the list verl writes into its own Prometheus config). Its driver hands
each rollout, training and validation alike, to an agent loop manager with the step in the
batch. In the driver's process :func:`install` (the setup hook calls it) wraps:

* ``LLMServerManager._initialize_llm_servers``: after it, each server's ``/metrics`` URL joins
  the process's engines (unless verl runs them with ``rollout.disable_log_stats``, its default:
  then a warning says to set ``actor_rollout_ref.rollout.disable_log_stats=False``);
* the legacy trainer's ``AgentLoopManager.generate_sequences`` (``trainer.use_v1=False``),
  which returns the generated batch: an :class:`~rlpulse.producer.enginewatch.EngineWatch`
  window around the call, at ``meta_info["global_steps"]``;
* the v1 trainers' ``AgentLoopManagerTQ.generate_sequences`` (verl 0.9's default), which only
  dispatches (the trajectories reach TransferQueue and the trainer waits in its replay
  buffer): each dispatch ends the open window and begins one at the batch's ``global_steps``
  (``EngineWatch.next``), and the step's log ends the last (:func:`step_logged`, from the
  tracking backend's ``log``), so a step's window runs from its dispatch to the next dispatch
  or to its log, whichever comes first.

The driver's producer logs the step's ``rollout/engine/...`` (the names the in-process path
logs) merged over the servers. It is the ``rlpulse`` tracking backend's, made when ``fit()``
builds ``Tracking`` (before any generation): :func:`watch` is called then, :func:`stop` at its
``finish``. ``RLPULSE_ENGINES`` adds engines verl did not start. Replicas added elsewhere
(verl's fully asynchronous recipes' rollouter) are not followed.

>>> metrics_url("10.0.0.7:8000"), metrics_url("[::1]:8000")
('http://10.0.0.7:8000/metrics', 'http://[::1]:8000/metrics')
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
from collections.abc import Iterable
from types import ModuleType
from typing import Any

from rlpulse.producer.enginewatch import EngineWatch, Logs
from rlpulse.producer.integrations.verl_compat import OnImport

log = logging.getLogger("rlpulse.integrations.verl")

LLM_SERVER = "verl.workers.rollout.llm_server"
AGENT_LOOP = "verl.experimental.agent_loop.agent_loop"
AGENT_LOOP_TQ = "verl.trainer.ppo.v1.agent_loop_tq"
_MARK = "_rlpulse_engines_original"
_SERVERS: list[str] = []
"""The ``/metrics`` URLs of the servers this process's ``LLMServerManager`` started."""
_WATCH: EngineWatch | None = None
"""The driver's watch, from :func:`watch` to :func:`stop`."""
_ON_IMPORT: OnImport | None = None


def metrics_url(address: str) -> str:
    """The ``/metrics`` URL of a verl server address (``host:port``, ``[v6]:port``)."""
    return f"http://{address}/metrics"


def servers_started(addresses: Iterable[str]) -> None:
    """Note servers the driver started (what the wrapped ``_initialize_llm_servers`` calls)."""
    urls = [metrics_url(a) for a in addresses if a]
    _SERVERS.extend(u for u in urls if u not in _SERVERS)
    if _WATCH is not None:
        _WATCH.add(urls)


def watch(producer: Logs) -> EngineWatch:
    """The driver's watch, logging through ``producer`` (the tracking backend's): the servers
    noted so far and those ``RLPULSE_ENGINES`` names."""
    global _WATCH
    stop()
    _WATCH = EngineWatch(producer, list(_SERVERS))
    return _WATCH


def stop() -> None:
    """Close the driver's watch (the tracking backend's ``finish``); safe to call twice."""
    global _WATCH
    current, _WATCH = _WATCH, None
    if current is not None:
        current.close()


def install() -> None:
    """Wrap verl's ``LLMServerManager._initialize_llm_servers`` and
    ``AgentLoopManager.generate_sequences`` in this process, as soon as their modules are
    imported (idempotent)."""
    global _ON_IMPORT
    if _ON_IMPORT is None:
        _ON_IMPORT = OnImport((LLM_SERVER, AGENT_LOOP, AGENT_LOOP_TQ), _wrap)
        _ON_IMPORT.install()


def uninstall() -> None:
    """Undo :func:`install` (tests), forget the servers and stop the watch."""
    global _ON_IMPORT
    if _ON_IMPORT is not None:
        _ON_IMPORT.uninstall()
        _ON_IMPORT = None
    for module, cls, name in (
        (LLM_SERVER, "LLMServerManager", "_initialize_llm_servers"),
        (AGENT_LOOP, "AgentLoopManager", "generate_sequences"),
        (AGENT_LOOP_TQ, "AgentLoopManagerTQ", "generate_sequences"),
    ):
        owner = getattr(sys.modules.get(module), cls, None)
        original = vars(owner).get(_MARK) if owner is not None else None
        if original is not None:
            setattr(owner, name, original)
            delattr(owner, _MARK)
    _SERVERS.clear()
    stop()


def _wrap(module: ModuleType) -> None:
    """Wrap the class of ``module`` (just imported) that this hook follows."""
    if module.__name__ == LLM_SERVER:
        manager = module.LLMServerManager
        if _MARK in vars(manager):
            return
        original_init = manager._initialize_llm_servers

        @functools.wraps(original_init)
        async def _initialize_llm_servers(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = await original_init(self, *args, **kwargs)
            _note(self)
            return result

        setattr(manager, _MARK, original_init)
        setattr(manager, "_initialize_llm_servers", _initialize_llm_servers)  # noqa: B010
    elif module.__name__ == AGENT_LOOP:
        loop = module.AgentLoopManager
        if _MARK in vars(loop):
            return
        original_generate = loop.generate_sequences
        setattr(loop, _MARK, original_generate)
        setattr(loop, "generate_sequences", _watched(original_generate))  # noqa: B010
    elif module.__name__ == AGENT_LOOP_TQ:
        dispatcher = module.AgentLoopManagerTQ
        if _MARK in vars(dispatcher):
            return
        original_dispatch = dispatcher.generate_sequences
        setattr(dispatcher, _MARK, original_dispatch)
        setattr(dispatcher, "generate_sequences", _dispatching(original_dispatch))  # noqa: B010


def step_logged() -> None:
    """The driver logged a step (the tracking backend's ``log``): its generation is over, so
    the window a dispatch opened (verl's v1 trainers) ends, at its own step."""
    current = _WATCH
    if current is not None:
        current.end_open()


def _dispatching(original: Any) -> Any:
    """verl v1's ``AgentLoopManagerTQ.generate_sequences``: it hands the batch to the agent
    loop workers and returns without waiting (the trajectories reach TransferQueue, and the
    trainer waits in its replay buffer), so a dispatch ends the window open (at its step) and
    begins one at the batch's step (:meth:`EngineWatch.next`); the step's log ends the last."""

    @functools.wraps(original)
    def generate_sequences(self: Any, prompts: Any, *args: Any, **kwargs: Any) -> Any:
        current, step = _WATCH, _step(prompts)
        if current is not None and step is not None:
            current.next(step)
        return original(self, prompts, *args, **kwargs)

    return generate_sequences


def _watched(original: Any) -> Any:
    """``generate_sequences`` inside a window at its batch's step. verl's is an ``async``
    method under ``auto_await`` (which runs it for a plain call and hands an awaiting caller
    the coroutine, judging by who calls it): the window goes around the ``async`` method, and
    ``auto_await`` over it again, so its callers see no difference."""
    from verl.utils.ray_utils import auto_await

    inner = getattr(original, "__wrapped__", None)
    if inner is None or not inspect.iscoroutinefunction(inner):  # a plain method

        @functools.wraps(original)
        def plain(self: Any, prompts: Any, *args: Any, **kwargs: Any) -> Any:
            current, step = _WATCH, _step(prompts)
            if current is None or step is None:
                return original(self, prompts, *args, **kwargs)
            with current.window(step):
                return original(self, prompts, *args, **kwargs)

        return plain

    @functools.wraps(inner)
    async def watched(self: Any, prompts: Any, *args: Any, **kwargs: Any) -> Any:
        current, step = _WATCH, _step(prompts)
        if current is None or step is None:
            return await inner(self, prompts, *args, **kwargs)
        with current.window(step):
            return await inner(self, prompts, *args, **kwargs)

    return auto_await(watched)


def _note(manager: Any) -> None:
    """The servers a manager started, unless verl runs them without statistics."""
    addresses = list(getattr(manager, "server_addresses", None) or ())
    if not addresses:
        return
    rollout = getattr(manager, "rollout_config", None)
    if rollout is not None and getattr(rollout, "disable_log_stats", False):
        log.warning(
            "rlpulse: verl's rollout servers run with disable_log_stats=True, so their "
            "/metrics count nothing: set actor_rollout_ref.rollout.disable_log_stats=False for "
            "rollout/engine/... per step"
        )
        return
    servers_started(addresses)


def _step(prompts: Any) -> int | None:
    """The driver's step a generation batch carries: ``meta_info["global_steps"]`` of a
    ``DataProto``, the ``global_steps`` non-tensor entry of a ``TensorDict`` (v1)."""
    meta = getattr(prompts, "meta_info", None)
    if isinstance(meta, dict):
        step = meta.get("global_steps")
    else:
        try:
            from verl.utils.tensordict_utils import get_non_tensor_data

            step = get_non_tensor_data(prompts, "global_steps", None)
        except Exception:  # not a TensorDict of verl's: no step, no window
            return None
    try:
        return int(step) if step is not None else None
    except (TypeError, ValueError):
        return None
