"""ROLL's ``rlpulse`` tracker: what ROLL's driver logs, as the driver's values.

ROLL builds one tracker, ``create_tracker(track_with, config=pipeline_config.to_dict(),
**tracker_kwargs)``, and calls ``log(values, step)`` once per step with every metric of the
step, in the driver process. :class:`RlpulseTracker` (registered as ``rlpulse`` by
``rlpulse.producer.integrations.roll.register``):

* strips ROLL's reducer tags (``actor/pg_loss@sum`` -> ``actor/pg_loss``), maps rlvr's
  ``token/...`` onto the catalog's ``tokens/...`` and flattens dict values (``name/key``);
* sends each value once as the driver's (:class:`~rlpulse.producer.integrations.driver.DriverStream`),
  except the names the hooked workers log exactly (``roll_states.worker_side``);
* says the driver is done with the step, and has every ROLL worker say so too (the driver ends
  a step after its workers): a step ROLL skips (no valid response, where no worker trains) is
  emitted at once instead of waiting for workers;
* resumes the run on the collector when ROLL resumes from a checkpoint: ROLL then re-logs the
  whole history (``BasePipeline.__init__``); the collector keeps each step once (those it had
  are left out and told back, ``stats()["dropped_late"]``; those it had not are recorded);
* sends the resolved config to the collector (``Producer.run_config``), whose sinks record it
  as ROLL's own TensorBoard and W&B trackers do (hyper-parameters, the run's config), and saves
  it as ``runs/<run>/config.yaml`` on the driver's host;
* logs each step's trained generations as ``rollout/samples`` and each validation's as
  ``val/samples`` (``samples``; ``roll_samples``);
* flushes and closes at the process's exit (ROLL never calls ``finish()``), the workers'
  producers first.

>>> RlpulseTracker.clean({"actor/pg_loss@sum": 0.5, "token/response_length/mean": 9.0})
{'actor/pg_loss': 0.5, 'tokens/response_length/mean': 9.0}
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Protocol

from rlpulse.producer.client import Producer
from rlpulse.producer.env import expected_roles_from_env
from rlpulse.producer.integrations import roll_states
from rlpulse.producer.integrations.driver import DriverStream, save_run_config
from rlpulse.producer.integrations.roll_samples import RollSamples
from rlpulse.producer.integrations.roll_settings import SECTION, RollSettings, resumes

log = logging.getLogger("rlpulse.integrations.roll")

TOKEN_PREFIX = ("token/", "tokens/")
"""rlvr's prefix of its length metrics, and the catalog's (agentic's and ROLL's docs')."""


class Workers(Protocol):
    """What the tracker asks of ROLL's workers (``roll.DriverHooks``; a recorder in tests)."""

    def hooked(self) -> bool: ...

    def step_over(self, step: int) -> None: ...

    def close(self, timeout: float) -> None: ...


class _NoWorkers:
    def hooked(self) -> bool:
        return False

    def step_over(self, step: int) -> None:
        pass

    def close(self, timeout: float) -> None:
        pass


class RlpulseTracker:
    """ROLL's ``rlpulse`` tracker (see the module docstring). ``log()`` never raises and never
    blocks; bad ``tracker_kwargs`` raise ConfigError here, when ROLL starts, naming the field.

    >>> # tracker = RlpulseTracker(pipeline_config.to_dict(), run="grpo-1")
    >>> # tracker.log({"critic/score/mean": 0.4}, step=1)
    """

    workers: ClassVar[Workers] = _NoWorkers()
    """ROLL's workers, as the driver hooks see them (set by ``roll.register``)."""

    def __init__(
        self,
        config: Mapping[str, Any],
        *,
        producer_factory: Callable[..., Producer] = Producer,
        **kwargs: Any,
    ) -> None:
        settings = RollSettings.from_config(config, kwargs)
        self.settings = settings
        self.config_path: Path | None = None
        if settings.config_dir is not None:
            directory = settings.config_dir.replace("{run}", settings.run)
            self.config_path = save_run_config(
                directory, dict(config), f"{SECTION}.config_dir"
            ).resolve()
        self.producer = producer_factory(
            settings.address,
            run=settings.run,
            role=settings.role,
            rank=0,
            world_size=1,
            expected_roles={**expected_roles_from_env(), settings.role: 1},
            reductions=roll_states.REDUCTIONS,
            resume=resumes(config),
            config=settings.producer,
        )
        self.producer.run_config(config)  # the collector's sinks record it as the run's
        worker_side = settings.worker_side
        self.exact = settings.exact and self.workers.hooked()
        if self.exact:  # the hooked workers log these exactly (roll_worker)
            worker_side += roll_states.worker_side(config)
        self.stream = DriverStream(self.producer, worker_side=worker_side)
        self.samples = RollSamples(self.producer) if settings.samples else None
        """Logs ROLL's trained and validation batches (``roll_samples``, hooked by
        ``roll.register``)."""
        self._lock = threading.Lock()
        self._last: int | None = None
        self._finished = False
        self._counts = {"logged_steps": 0, "no_step": 0}
        atexit.register(self.finish)

    @staticmethod
    def clean(values: Mapping[str, Any]) -> dict[str, Any]:
        """ROLL's names as rlpulse's: tags stripped, ``token/`` as ``tokens/``, a dict value
        flattened to ``name/key`` (as ROLL's TensorBoard tracker writes one)."""
        out: dict[str, Any] = {}
        for key, value in values.items():
            name = key.rsplit("@", 1)[0] if isinstance(key, str) and "@" in key else str(key)
            if name.startswith(TOKEN_PREFIX[0]):
                name = TOKEN_PREFIX[1] + name[len(TOKEN_PREFIX[0]) :]
            if isinstance(value, Mapping):
                for sub, inner in RlpulseTracker.clean(value).items():
                    out[f"{name}/{sub}"] = inner
            else:
                out[name] = value
        return out

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """ROLL's ``tracker.log(values=metrics, step=global_step)``."""
        try:
            if step is None:
                self._counts["no_step"] += 1
                return
            with self._lock:
                self.stream.log(self.clean(values), step)
                self.producer.step_done(int(step))
                self._counts["logged_steps"] += 1
                newer = self._last is None or step > self._last
                self._last = step if newer else self._last
            if newer:
                self.workers.step_over(int(step))
        except Exception as exc:  # never into ROLL's loop
            log.warning("rlpulse: tracker.log failed and was skipped: %r", exc)

    def finish(self) -> None:
        """Close the workers' producers, then send what is queued and close (at exit, or
        when called; safe twice)."""
        with self._lock:
            if self._finished:
                return
            self._finished = True
        atexit.unregister(self.finish)
        timeout = self.settings.producer.close_timeout_s
        try:
            self.workers.close(timeout)
        except Exception as exc:
            log.warning("rlpulse: the workers' producers were not closed: %r", exc)
        self.producer.close()
        stats = self.producer.stats()
        lost = stats["unacked"] + stats["dropped_send"]
        if lost:
            log.warning("rlpulse: %d messages of run %r not acknowledged", lost, self.settings.run)

    def stats(self) -> dict[str, int]:
        """The tracker's, the driver stream's, the samples' and the producer's counts."""
        samples = self.samples.stats() if self.samples is not None else {}
        return {**self._counts, **self.stream.stats(), **samples, **self.producer.stats()}
