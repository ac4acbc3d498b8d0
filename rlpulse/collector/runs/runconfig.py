"""Each run's configuration (its hyper-parameters): kept with the run, carried by its next step.

A producer's hello carries the run's config (``Producer.run_config``, ``Hello.config``) every
time it is sent, unchanged. Only a change from that producer's previous hello is read
(``rlpulse.schemas.runconfig.decode``; a bad one is counted as ``bad_config`` and warned about,
the hello stands), and when it differs from the run's config it becomes the run's. The run's
next emitted step carries it (``StepRecord.config``), so every sink receives it with the run's
data, in order, through the outbox and restarts; a later change rides on the step after it.
It is in the checkpoint and forgotten with the run (``runs.retention``).

A relay (``local``) reads nothing: it keeps each producer's bytes (``ProducerInfo.config``)
and forwards them in its members (``Member.config``); the collector above does the rest.

>>> configs = RunConfigs(Health())
>>> prod = ProducerInfo(7, "r", "driver", 0, 1, "host", 0.0)
>>> configs.hello(prod, runconfig.encode({"lr": 1e-6}))
>>> out = []
>>> configs.attach("r", out.append)(StepRecord(run="r", step=0, metrics={}))
>>> out[0].config, configs.pending
({'lr': 1e-06}, set())
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

from rlpulse.collector.health import Health
from rlpulse.collector.ratelog import RateLimitedLog
from rlpulse.collector.runs.members import ProducerInfo
from rlpulse.schemas import runconfig
from rlpulse.schemas.errors import SchemaError
from rlpulse.schemas.record import StepRecord

log = logging.getLogger("rlpulse.collector")
Emit = Callable[[Any], None]


class RunConfigs:
    """The runs' configs, and which of them no emitted step has carried yet."""

    def __init__(self, health: Health, *, local: bool = False) -> None:
        self.health = health
        self.local = local
        self.by_run: dict[str, dict[str, Any]] = {}
        self.pending: set[str] = set()
        """Runs whose config goes out with their next step."""
        self._ratelog = RateLimitedLog(log)

    def hello(self, prod: ProducerInfo, data: bytes) -> None:
        """``prod``'s hello (or its relay's member) carried the config ``data``."""
        if prod.ghost or not prod.logs or data == prod.config:
            return
        prod.config = data
        if not data or self.local:
            return
        try:
            values = runconfig.decode(data)
        except SchemaError as exc:
            self.health.reject(exc.reason)
            self._ratelog.warn(
                f"config:{prod.run}",
                f"run {prod.run!r}: {prod.role}/{prod.rank} sent a run config that is not one "
                f"({exc.detail}); ignored",
            )
            return
        if self.by_run.get(prod.run) == values:
            return
        self.by_run[prod.run] = values
        self.pending.add(prod.run)
        log.info(
            "run %r: its config (%d top-level keys, %d bytes) came from %s/%d",
            prod.run,
            len(values),
            len(data),
            prod.role,
            prod.rank,
        )

    def attach(self, run: str, emit: Emit) -> Emit:
        """``emit``, putting the run's config on the step it is given when no step carried it
        yet (the aggregator emits each finished step through it)."""
        if run not in self.pending:
            return emit

        def with_config(record: Any) -> None:
            if isinstance(record, StepRecord) and record.run in self.pending:
                self.pending.discard(record.run)
                record = dataclasses.replace(record, config=self.by_run[record.run])
            emit(record)

        return with_config

    def emitted(self, record: Any) -> None:
        """Recovery: ``record`` is in the outbox already; the config it carries went out."""
        config = getattr(record, "config", None)
        if isinstance(record, StepRecord) and config:
            self.by_run[record.run] = dict(config)
            self.pending.discard(record.run)

    def forget(self, run: str) -> None:
        self.by_run.pop(run, None)
        self.pending.discard(run)

    def snapshot(self) -> dict[str, list[Any]]:
        """For the checkpoint: per run, ``[config, whether a step still has to carry it]``."""
        return {run: [values, run in self.pending] for run, values in self.by_run.items()}

    def restore(self, saved: Mapping[str, list[Any]]) -> None:
        for run, (values, pending) in saved.items():
            self.by_run[run] = dict(values)
            if pending:
                self.pending.add(run)
