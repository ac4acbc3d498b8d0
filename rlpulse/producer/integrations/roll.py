"""ROLL (alibaba/ROLL): rlpulse from one block of the YAML a ROLL user already runs.

.. code-block:: yaml

    track_with: rlpulse
    tracker_kwargs:
      address: tcp://collector-host:5555
      run: ${exp_name}  # block style: in a flow mapping, YAML reads the braces of ${...}
    system_envs:
      RAY_RUNTIME_ENV_HOOK: rlpulse.producer.integrations.roll.ray_hook

ROLL copies ``system_envs`` into the driver's environment when it builds its config, before its
own ``ray.init``, and into every worker's. Ray passes the job's runtime environment through
the function ``RAY_RUNTIME_ENV_HOOK`` names, inside that ``ray.init``, in the driver:
:func:`ray_hook` there

* registers ``rlpulse`` in ROLL's tracker registry (:func:`register`), so ROLL's
  ``create_tracker`` builds a :class:`~rlpulse.producer.integrations.roll_tracker.RlpulseTracker`;
* hooks the driver's ROLL ``Cluster`` so the tracker can tell every worker when a step ends,
  and the driver's functions that hold ROLL's batches so the tracker logs their generations
  (:mod:`~rlpulse.producer.integrations.roll_samples`);
* adds :func:`worker_setup` as the job's ``worker_process_setup_hook``: every ROLL worker
  process then wraps ROLL's loss functions and worker calls as they are imported
  (:mod:`~rlpulse.producer.integrations.roll_worker`).

It chains to the hooks a user already had: a ``RAY_RUNTIME_ENV_HOOK`` of their own goes in
``RLPULSE_RAY_RUNTIME_ENV_HOOK`` (it runs first); under ``uv run`` (whose hook Ray calls
instead of any other unless ``RAY_ENABLE_UV_RUN_RUNTIME_ENV=0``) uv's runs first; a
``worker_process_setup_hook`` already in the runtime environment runs after :func:`worker_setup`
in every worker.

A user who calls ``ray.init`` before ROLL does (ROLL then skips its own) calls :func:`register`
and passes ``runtime_env={"worker_process_setup_hook": SETUP_HOOK}`` to their ``ray.init``.

>>> SETUP_HOOK
'rlpulse.producer.integrations.roll.worker_setup'
"""

from __future__ import annotations

import importlib
import logging
import os
import weakref
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from rlpulse.producer.integrations import roll_compat as C, roll_worker
from rlpulse.producer.integrations.onimport import OnImport
from rlpulse.producer.integrations.roll_samples import SamplesHooks
from rlpulse.producer.integrations.roll_settings import TRACKER
from rlpulse.producer.integrations.roll_tracker import RlpulseTracker

log = logging.getLogger("rlpulse.integrations.roll")

RUNTIME_ENV_HOOK = f"{__name__}.ray_hook"
"""What ``RAY_RUNTIME_ENV_HOOK`` names."""
SETUP_HOOK = f"{__name__}.worker_setup"
"""What the job's ``worker_process_setup_hook`` names."""
CHAIN_VAR = "RLPULSE_RAY_RUNTIME_ENV_HOOK"
"""A ``RAY_RUNTIME_ENV_HOOK`` of the user's, run before :func:`ray_hook` adds rlpulse's."""
NEXT_SETUP_VAR = "RLPULSE_NEXT_SETUP_HOOK"
"""The ``worker_process_setup_hook`` the job had before, run after :func:`worker_setup`."""


def _load(path: str) -> Callable[..., Any]:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _uv_hook(env: dict[str, Any]) -> dict[str, Any]:
    """Ray's ``uv run`` propagation, when the driver runs under ``uv run`` (Ray calls only one
    hook; with ``RAY_ENABLE_UV_RUN_RUNTIME_ENV=0`` it is ours, which runs uv's first)."""
    if _ray() is None:  # Ray calls this hook from its ray.init: Ray is imported then
        return env
    try:
        from ray._private.runtime_env import uv_runtime_env_hook as uv
    except ImportError:
        return env
    if not uv._get_uv_run_cmdline():
        return env
    return dict(uv.hook(env))


def ray_hook(runtime_env: Mapping[str, Any] | None) -> dict[str, Any]:
    """Ray's ``RAY_RUNTIME_ENV_HOOK``: the job's runtime environment with rlpulse's worker
    setup hook added; registers the tracker in this (the driver's) process."""
    env = dict(runtime_env or {})
    chained = os.environ.get(CHAIN_VAR)
    env = dict(_load(chained)(env)) if chained else _uv_hook(env)
    register()
    DRIVER.workers_hooked = os.environ.get(C.EXACT_VAR, "1").strip().lower() not in ("0", "false")
    previous = env.get("worker_process_setup_hook")
    if previous not in (None, SETUP_HOOK, worker_setup):
        if not isinstance(previous, str):
            raise TypeError(
                "rlpulse: the job's worker_process_setup_hook is a function; give it as a "
                "module path string so rlpulse can chain to it"
            )
        env["env_vars"] = {**(env.get("env_vars") or {}), NEXT_SETUP_VAR: previous}
    env["worker_process_setup_hook"] = SETUP_HOOK
    return env


class DriverHooks:
    """The driver's view of ROLL's workers: the ``Cluster`` objects ROLL builds (kept weakly),
    to tell every worker when a step ends and to close their producers at exit, through Ray's
    ``__ray_call__``."""

    def __init__(self) -> None:
        self.clusters: weakref.WeakSet[Any] = weakref.WeakSet()
        self._on_import: OnImport | None = None
        self._undo: list[tuple[Any, str, Any]] = []
        self.workers_hooked = False
        self._warned = False

    def install(self) -> None:
        if self._on_import is None:
            self._on_import = OnImport({C.CLUSTER}, self._wrap_cluster)
            self._on_import.install()

    def uninstall(self) -> None:
        if self._on_import is not None:
            self._on_import.uninstall()
            self._on_import = None
        while self._undo:
            owner, name, original = self._undo.pop()
            setattr(owner, name, original)

    def _wrap_cluster(self, module: ModuleType) -> None:
        cls = getattr(module, "Cluster", None)
        if cls is None or getattr(vars(cls)["__init__"], "_rlpulse", False):
            return
        original = vars(cls)["__init__"]
        hooks = self

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            hooks.clusters.add(self)

        __init__._rlpulse = True  # type: ignore[attr-defined]
        self._undo.append((cls, "__init__", original))
        setattr(cls, "__init__", __init__)  # noqa: B010

    def hooked(self) -> bool:
        """Whether ROLL's workers run :func:`worker_setup` (the driver then leaves their exact
        names out): set by :func:`ray_hook`, or seen in Ray's job runtime environment."""
        if self.workers_hooked:
            return True
        ray = _ray()
        if ray is None or not ray.is_initialized():
            return False
        env = ray.get_runtime_context().runtime_env or {}
        exact = (env.get("env_vars") or {}).get(C.EXACT_VAR, "1").strip().lower()
        return env.get("worker_process_setup_hook") in (SETUP_HOOK, worker_setup) and exact not in (
            "0",
            "false",
        )

    def _handles(self) -> list[Any]:
        return [w for cluster in list(self.clusters) for w in getattr(cluster, "workers", ())]

    def step_over(self, step: int) -> None:
        """Every worker has finished ``step`` (fire and forget: nothing waits)."""
        for worker in self._handles():
            call = getattr(worker, "__ray_call__", None)
            if call is None:
                self._warn_no_call()
                return
            call.remote(roll_worker.step_over, step)

    def close(self, timeout: float) -> None:
        """Flush and close every worker's producer, waiting at most ``timeout`` seconds."""
        ray = _ray()
        handles = self._handles()
        if ray is None or not handles or not ray.is_initialized():
            return
        refs = [
            w.__ray_call__.remote(roll_worker.close_all, timeout)
            for w in handles
            if hasattr(w, "__ray_call__")
        ]
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=timeout + 1.0)

    def _warn_no_call(self) -> None:
        if not self._warned:
            self._warned = True
            log.warning(
                "rlpulse: this Ray has no __ray_call__ on actors: a step is emitted when every "
                "ROLL worker has logged a later one"
            )


def _ray() -> Any:
    import sys

    return sys.modules.get("ray")


DRIVER = DriverHooks()
"""This process's driver hooks (installed by :func:`register`)."""
SAMPLES = SamplesHooks()
"""This process's hooks of the batches the driver holds (installed by :func:`register`)."""


def register() -> None:
    """Make ``rlpulse`` a tracker of ROLL's registry in this process and hook its clusters
    (idempotent). ConfigError naming what differs on a ROLL whose registry is not the one the
    tracker joins."""
    tracking = importlib.import_module(C.TRACKING)
    C.check_tracking(tracking)
    tracking.tracker_registry[TRACKER] = RlpulseTracker
    DRIVER.install()
    SAMPLES.install()
    RlpulseTracker.workers = DRIVER


def unregister() -> None:
    """Undo :func:`register` (tests)."""
    tracking = importlib.import_module(C.TRACKING)
    if tracking.tracker_registry.get(TRACKER) is RlpulseTracker:
        del tracking.tracker_registry[TRACKER]
    DRIVER.uninstall()
    DRIVER.workers_hooked = False
    SAMPLES.uninstall()


WORKER_HOOK: roll_worker.WorkerHook | None = None


def worker_setup() -> None:
    """The job's ``worker_process_setup_hook``: hook ROLL's workers in this process (unless
    ``RLPULSE_ROLL_EXACT=0``: then phases only), then run the hook the job had before."""
    global WORKER_HOOK
    exact = os.environ.get(C.EXACT_VAR, "1").strip().lower() not in ("0", "false")
    if WORKER_HOOK is None:
        WORKER_HOOK = roll_worker.WorkerHook(exact=exact)
        WORKER_HOOK.install()
    following = os.environ.get(NEXT_SETUP_VAR)
    if following:
        _load(following)()
