"""verl: an ``rlpulse`` backend for verl's ``Tracking``, and producers for verl's workers.

verl picks its trackers with ``rlpulse.trainer.logger=[...]`` and builds them in
``verl.utils.tracking.Tracking``, a fixed if-chain with no registry or entry point. So
:func:`register` extends that class in place, in the process that builds it: ``"rlpulse"``
joins ``Tracking.supported_backend``, ``Tracking.__init__`` adds an :class:`RlpulseBackend`
when the backend is named, and ``Tracking.finish`` (also what verl's ``__del__`` calls) closes
it after verl's own backends. Call it once per process, before ``Tracking`` is built; on Ray
(verl's PPO driver runs in a ``TaskRunner`` actor) let Ray call it in every worker process:

    python -m verl.trainer.main_ppo ... trainer.logger='[console,rlpulse]' \\
        +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=rlpulse.producer.integrations.verl.register

Every metric verl's driver logs then reaches the collector as the *driver's value*
(:mod:`rlpulse.producer.integrations.driver`): one producer (role ``driver``, rank 0 of 1), one sample
per name and step, never merged again. Settings come from the optional ``rlpulse.trainer.rlpulse``
section of verl's config (:class:`VerlSettings`); the run is ``rlpulse.trainer.experiment_name``.

verl builds ``Tracking`` in ``fit()``, after its workers: so that the collector waits for the
driver instead of emitting the workers' steps without it, :func:`register` also declares it
for every producer :func:`worker_producer` makes in the job (``RLPULSE_EXPECTED_ROLES``).

The same hook makes verl's loss metrics exact (:mod:`rlpulse.producer.integrations.verl_loss`):
it wraps verl's loss functions before the workers bind them, so every actor and critic worker
logs each training micro-batch's ``actor/pg_loss``, ``actor/pg_clipfrac``, ``actor/ppo_kl``,
``critic/vf_loss``, ``critic/vf_clipfrac``... as mergeable states, for the driver's step, and
the driver leaves its own approximations of those names out (a mean over data-parallel ranks of
each rank's micro-batch means). ``RLPULSE_VERL_EXACT=0`` in the job's environment turns that
off, and the rest below with it. For metrics of your own, :func:`worker_producer` gives a verl
worker its producer, and ``rlpulse.trainer.rlpulse.worker_side`` names them so the driver leaves
its approximation out. verl's validation generations (``trainer.log_val_generations=N``) go
out as ``val/samples`` (:mod:`rlpulse.producer.integrations.verl_samples`).

It also times every worker call verl's driver makes as a phase of its role on the rank that
runs it (:mod:`~rlpulse.producer.integrations.verl_phases`: timelines, ``straggler/...``), and
the driver logs each step's trained generations as ``rollout/samples`` and the rollout engine's
log-probs against the trainer's as ``rollout/logprob_diff`` quantiles
(:mod:`~rlpulse.producer.integrations.verl_trainer`). The rollout servers verl starts
are scraped around each generation and the driver logs their metrics per step
(``rollout/engine/...``; :mod:`rlpulse.producer.integrations.verl_engines`).

>>> from rlpulse.producer.integrations import verl as rlpulse_verl
>>> # rlpulse_verl.register(); Tracking("proj", "run-1", ["console", "rlpulse"], config=cfg)
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

from rlpulse.producer.client import Producer
from rlpulse.producer.env import EXPECTED_ROLES_VAR, expected_roles_from_env
from rlpulse.producer.integrations import verl_engines
from rlpulse.producer.integrations.driver import DriverStream, save_run_config
from rlpulse.producer.integrations.verl_compat import check
from rlpulse.producer.integrations.verl_loss import LossHook
from rlpulse.producer.integrations.verl_meta import META_KEY, STEP_KEY, batch_meta as _batch_meta
from rlpulse.producer.integrations.verl_phases import WorkerPhases
from rlpulse.producer.integrations.verl_samples import ValGenerations, install, uninstall
from rlpulse.producer.integrations.verl_settings import BACKEND, SECTION, VerlSettings
from rlpulse.producer.integrations.verl_states import REDUCTIONS, exact_names
from rlpulse.producer.integrations.verl_trainer import TrainerHook
from rlpulse.schemas.errors import ConfigError

log = logging.getLogger("rlpulse.integrations.verl")

__all__ = [
    "BACKEND",
    "META_KEY",
    "SECTION",
    "STEP_KEY",
    "RlpulseBackend",
    "VerlSettings",
    "batch_meta",
    "register",
    "unregister",
    "worker_producer",
]
RUN_VAR = "RLPULSE_RUN"
"""The run name a worker's producer logs under (set it to ``rlpulse.trainer.experiment_name``)."""
EXACT_VAR = "RLPULSE_VERL_EXACT"
"""``0`` (or ``false``): :func:`register` leaves verl's code alone (its loss functions, driver
and worker methods): the driver then sends verl's own values of its loss metrics, and no
phases, training samples or mismatch are logged."""
DRIVER_DECLARED = "driver=1"
"""What :func:`register` puts in ``RLPULSE_EXPECTED_ROLES`` when it is unset: the run has a
``driver`` (the ``Tracking`` backend's default role) of world size 1."""
_MARK = "_rlpulse_originals"


class RlpulseBackend:
    """verl's ``rlpulse`` tracking backend: the driver's metrics, as the driver's values.

    Built by ``Tracking`` (after :func:`register`) with verl's project, experiment and
    config; ``log()`` hands verl's dict to a :class:`DriverStream` (never blocks, never
    raises), ``finish()`` sends what is left and closes the producer (safe to call twice).
    Bad settings raise ConfigError here, when verl starts, naming the field.

    >>> # backend = RlpulseBackend("proj", "run-1", {"trainer": {"rlpulse": {...}}})
    >>> # backend.log({"critic/score/mean": 0.4}, step=1); backend.finish()
    """

    def __init__(
        self,
        project_name: str,
        experiment_name: str,
        config: Mapping[str, Any] | None,
        *,
        producer_factory: Callable[..., Producer] = Producer,
    ) -> None:
        settings = VerlSettings.from_config(config, experiment_name)
        self.settings = settings
        self.config_path: Path | None = None
        if settings.config_dir is not None:
            directory = settings.config_dir.replace("{run}", settings.run)
            self.config_path = save_run_config(
                directory, dict(config or {}), f"{SECTION}.config_dir"
            ).resolve()
            log.info("rlpulse: verl config of run %r saved to %s", settings.run, self.config_path)
        self.producer = producer_factory(
            settings.address,
            run=settings.run,
            role=settings.role,
            rank=0,
            world_size=1,
            expected_roles={**settings.expected_roles, settings.role: 1},
            config=settings.producer,
        )
        if config:  # the collector's sinks record it (hparams, the W&B run's config...)
            self.producer.run_config(config)
        worker_side = settings.worker_side
        if _LOSS_HOOK is not None and workers_hooked():  # they log these exactly (verl_loss)
            worker_side += exact_names(dict(config or {}))
        self.stream = DriverStream(self.producer, worker_side=worker_side)
        self.generations = ValGenerations.open(project_name, experiment_name, self.producer)
        self.engines = verl_engines.watch(self.producer)  # verl's rollout servers, per step

    def log(self, data: Mapping[str, Any], step: int) -> None:
        """verl's ``Tracking.log`` calls this with every metric of a step."""
        self.stream.log(data, step)
        verl_engines.step_logged()  # the step's generation is over

    def finish(self) -> None:
        """Send what is queued, wait for the collector's acknowledgement (at most
        ``rlpulse.producer.close_timeout_s``) and close. A step is emitted when the next one starts or
        here, when the driver says it is done."""
        self.generations.close()
        verl_engines.stop()
        self.producer.close()
        stats = self.producer.stats()
        lost = stats["unacked"] + stats["dropped_send"]
        if lost:
            log.warning("rlpulse: %d messages of run %r not acknowledged", lost, self.settings.run)

    def stats(self) -> dict[str, int]:
        """The driver stream's counts, the validation samples' and the producer's."""
        return {**self.stream.stats(), **self.generations.stats(), **self.producer.stats()}


def register(environ: MutableMapping[str, str] = os.environ) -> None:
    """Make ``"rlpulse"`` a backend of verl's ``Tracking`` in this process (idempotent).

    Also usable as Ray's ``worker_process_setup_hook``
    (``rlpulse.producer.integrations.verl.register``), so verl's ``TaskRunner`` actor has it. It
    also sets ``RLPULSE_EXPECTED_ROLES=driver=1`` when unset, so the workers'
    :func:`worker_producer` declares the driver: the collector then waits for the driver,
    which registers only when ``fit()`` builds ``Tracking``, instead of emitting the workers'
    steps without it and dropping the driver's as late. (With ``rlpulse.trainer.rlpulse.role`` set,
    set ``RLPULSE_EXPECTED_ROLES`` to that role, ``=1``, in the job's ``env_vars``.)

    Unless ``RLPULSE_VERL_EXACT=0``, it also installs the exact loss hook
    (:mod:`~rlpulse.producer.integrations.verl_loss`) in this process, before verl's workers
    bind their loss functions, the driver's hook (``verl_trainer``) and the workers' phases
    (``verl_phases``); on a verl version the hooks do not fit it raises ConfigError naming the
    version (so the Ray job stops at start-up).
    """
    from verl.utils.tracking import Tracking

    global _LOSS_HOOK
    environ.setdefault(EXPECTED_ROLES_VAR, DRIVER_DECLARED)
    if _LOSS_HOOK is None and environ.get(EXACT_VAR, "1").strip().lower() not in ("0", "false"):
        check()
        hooks = (LossHook(_hook_producer), TrainerHook(), WorkerPhases(_hook_producer))
        for hook in hooks:
            hook.install()
        _LOSS_HOOK, _HOOKS[:] = hooks[0], hooks
    install()  # verl's validation generations (verl_samples)
    verl_engines.install()  # its rollout servers' metrics per step
    if _MARK in vars(Tracking):
        return
    original_init, original_finish = Tracking.__init__, Tracking.finish

    # verl's own signature, so Tracking's callers see no difference.
    def __init__(
        self: Any,
        project_name: str,
        experiment_name: str,
        default_backend: str | list[str] = "console",
        config: Any = None,
    ) -> None:
        original_init(self, project_name, experiment_name, default_backend, config)
        named = [default_backend] if isinstance(default_backend, str) else default_backend
        if BACKEND in named:
            self.logger[BACKEND] = RlpulseBackend(project_name, experiment_name, config)

    # *args, **kwargs: whatever verl's finish takes (exit_code today) passes through unchanged.
    def finish(self: Any, *args: Any, **kwargs: Any) -> None:
        first = not getattr(self, "_finished", False)
        try:
            original_finish(self, *args, **kwargs)
        finally:
            backend = getattr(self, "logger", {}).get(BACKEND)
            if first and backend is not None:
                backend.finish()

    setattr(Tracking, _MARK, (original_init, original_finish))
    Tracking.supported_backend = [*Tracking.supported_backend, BACKEND]
    # setattr: a method assignment (mypy's method-assign, where verl's types are installed).
    setattr(Tracking, "__init__", __init__)  # noqa: B010
    setattr(Tracking, "finish", finish)  # noqa: B010


def unregister() -> None:
    """Undo :func:`register` (tests; a process that wants verl's class as shipped)."""
    from verl.utils.tracking import Tracking

    global _LOSS_HOOK
    while _HOOKS:
        _HOOKS.pop().uninstall()
    _LOSS_HOOK = None
    uninstall()
    verl_engines.uninstall()
    originals = vars(Tracking).get(_MARK)
    if originals is None:
        return
    setattr(Tracking, "__init__", originals[0])  # noqa: B010
    setattr(Tracking, "finish", originals[1])  # noqa: B010
    Tracking.supported_backend = [b for b in Tracking.supported_backend if b != BACKEND]
    delattr(Tracking, _MARK)


_LOSS_HOOK: LossHook | None = None
"""The exact loss hook :func:`register` installed in this process, if any."""
_HOOKS: list[Any] = []
"""Every hook :func:`register` installed in this process (the loss hook first)."""


SETUP_HOOK = f"{__name__}.register"
"""What Ray's ``worker_process_setup_hook`` names to run :func:`register` in every process."""


def workers_hooked() -> bool:
    """Whether this Ray job runs :func:`register` in its workers too (its runtime environment's
    ``worker_process_setup_hook``, without ``RLPULSE_VERL_EXACT=0``): only then does the driver
    leave out its own values of the loss metrics the hooked workers log."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return False
    env = ray.get_runtime_context().runtime_env or {}
    hook = env.get("worker_process_setup_hook")
    exact = (env.get("env_vars") or {}).get(EXACT_VAR, "1").strip().lower()
    return hook in (SETUP_HOOK, register) and exact not in ("0", "false")


def batch_meta(trainer: Any) -> dict[str, Any]:
    """What verl's driver (``trainer``, its ``RayPPOTrainer``) adds to the batch of an actor or
    critic update for the hooked workers (``verl_meta.batch_meta``): the step, the run and the
    collector's address, when the ``rlpulse`` backend is one of ``trainer.logger`` (else only
    that it is not: the workers then log nothing)."""
    return _batch_meta(trainer.config, trainer.global_steps)


def _hook_producer(
    role: str,
    run: str | None,
    address: str | None,
    rank: int | None = None,
    world_size: int | None = None,
) -> Producer:
    return worker_producer(
        role, run=run, address=address, reductions=REDUCTIONS, rank=rank, world_size=world_size
    )


_WORKER_PRODUCERS: dict[tuple[str, str, int, int], Producer] = {}
"""This process's worker producers by (role, run, rank, world size)."""


def worker_producer(
    role: str,
    *,
    run: str | None = None,
    address: str | None = None,
    reductions: Mapping[str, str] | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    environ: Mapping[str, str] = os.environ,
    producer_factory: Callable[..., Producer] = Producer,
) -> Producer:
    """This verl worker's producer for ``role``: made at the first call, the same one after,
    so a loss function may ask for it at every micro-batch (it closes when the process exits).

    Rank and world size are the worker's own, from the ``RANK`` and ``WORLD_SIZE`` that verl's
    worker group sets for every worker; the run from ``RLPULSE_RUN`` and the collector from
    ``RLPULSE_ADDRESS`` (pass both through ``ray_kwargs.ray_init.runtime_env.env_vars``); the
    roles it declares from ``RLPULSE_EXPECTED_ROLES`` (``driver=1`` after :func:`register`).
    ``reductions`` declares names outside the catalog (``{"actor/pg_clipfrac": "fraction"}``).
    ``run`` and ``address``, when given, override ``RLPULSE_RUN`` and ``RLPULSE_ADDRESS`` (the
    loss hook passes the driver's, which travel with the batch); ``rank`` and ``world_size``
    override ``RANK`` and ``WORLD_SIZE`` (a worker verl starts without them: its agent loop's).

    >>> # p = worker_producer("actor_train", reductions={"actor/pg_clipfrac": "fraction"})
    >>> # p.log({"actor/pg_clipfrac": Fraction(clipped, tokens)}, step=global_steps)
    """
    run = run or environ.get(RUN_VAR)
    if not run:
        raise ConfigError(RUN_VAR, "must name the run (the driver's trainer.experiment_name)")
    try:
        if rank is None or world_size is None:
            rank, world_size = int(environ["RANK"]), int(environ["WORLD_SIZE"])
    except (KeyError, ValueError) as exc:
        raise ConfigError(
            "RANK/WORLD_SIZE", "not set: call worker_producer() inside a verl worker", str(exc)
        ) from None
    key = (role, run, rank, world_size)
    producer = _WORKER_PRODUCERS.get(key)
    if producer is None:
        producer = _WORKER_PRODUCERS[key] = producer_factory(
            address,
            run=run,
            role=role,
            rank=rank,
            world_size=world_size,
            expected_roles=expected_roles_from_env(environ),
            reductions=reductions,
        )
    return producer
