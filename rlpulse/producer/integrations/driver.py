"""The *driver value* policy: what a framework logs after reducing it across ranks itself.

verl's driver and TRL's trainers log numbers that are already reductions across ranks (verl:
a mean over data-parallel ranks of each rank's mean; TRL: values gathered and averaged over
processes). Merging such a number again would only pretend to be exact. So a
:class:`DriverStream` sends each of them as the driver's value:

* from **one** producer (one rank), as **one** sample per name and step. Whatever reduction
  the catalog declares for the name, one sample reads back as itself (a mean of one number, a
  fraction ``x / 1``, a max of one), so the collector reports exactly what the framework
  logged, bit for bit;
* a name logged twice in one step keeps its first value: a repeat with the same value is
  ignored, one with another value is dropped and counted (``stats()["repeated"]``), never
  averaged with the first;
* names the run logs exactly from its workers (``worker_side``) are left out, so the
  framework's approximation never overwrites the exact value under the same name; so are
  names the collector derives itself from every rank (``system/tps``, ``system/samples``,
  a histogram's quantiles: the catalog's ``derived``), which it would refuse;
* anything that is not a single number (strings, tables, lists, None) is left out and counted.

>>> class Recorder:
...     def __init__(self): self.calls = []
...     def log(self, data, step): self.calls.append((step, dict(data)))
>>> stream = DriverStream(Recorder(), worker_side=["critic/advantages"])
>>> stream.log({"actor/pg_loss": 0.5, "critic/advantages/mean": 0.1, "note": "text"}, step=3)
>>> stream.producer.calls
[(3, {'actor/pg_loss': 0.5})]
"""

from __future__ import annotations

import logging
import math
import numbers
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import yaml

from rlpulse.producer.steps import BadStep, as_step
from rlpulse.schemas.catalog import Catalog
from rlpulse.schemas.errors import ConfigError
from rlpulse.schemas.metrics import CATALOG

log = logging.getLogger("rlpulse.integrations")
RUN_CONFIG = "config.yaml"
"""The file a run's configuration is saved as (what ``rlpulse compare`` reads)."""


class Sink(Protocol):
    """What a :class:`DriverStream` sends through: a ``Producer`` (or a recorder in tests)."""

    def log(self, data: Mapping[str, Any], step: int) -> None: ...


def as_number(value: Any) -> Any:
    """``value`` as one sample: a float, or a one-element CUDA tensor left as it is (the
    producer reads it without waiting for the GPU); None when it is not a single number."""
    if isinstance(value, (bool, numbers.Real)):  # int, float, numpy scalars
        return float(value)
    if isinstance(value, np.ndarray):
        return float(value.reshape(())) if value.size == 1 and value.dtype.kind in "biuf" else None
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.is_complex():
            return None
        # .item() on a GPU tensor would wait for the GPU: the producer snapshots it instead.
        return value.detach().reshape(()) if value.is_cuda else float(value.detach().item())
    return None


def _same(a: Any, b: Any) -> bool:
    """Whether two samples of one name are the same number (tensors are never compared: that
    would wait for the GPU)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return False


def worker_side_names(names: Iterable[str], catalog: Catalog = CATALOG) -> frozenset[str]:
    """The names a driver leaves out because workers log them exactly: each name, and for a
    catalog entry every name it reports under (``critic/advantages`` ->
    ``critic/advantages/mean``, ``/max``, ``/min``)."""
    out: set[str] = set()
    for name in names:
        out.add(name)
        entry = catalog.entries.get(name)
        if entry is not None:
            out.update(entry.output_names().values())
    return frozenset(out)


class DriverStream:
    """Sends a framework's own logged dict through ``producer`` under the driver value policy
    (see the module docstring). ``log()`` never raises and never blocks.

    ``stats()`` counts what was sent and what was left out: ``sent`` (values), ``not_numeric``,
    ``repeated`` (a second, different value for a name in one step), ``worker_side``,
    ``derived`` (names the collector computes).
    """

    def __init__(
        self,
        producer: Sink,
        *,
        worker_side: Iterable[str] = (),
        catalog: Catalog = CATALOG,
    ) -> None:
        self.producer = producer
        self.worker_side = worker_side_names(worker_side, catalog)
        self.catalog = catalog
        self._step: int | None = None
        self._sent: dict[str, Any] = {}
        self._counts = {"sent": 0, "not_numeric": 0, "repeated": 0, "worker_side": 0, "derived": 0}
        self._warned: set[str] = set()

    def log(self, data: Mapping[str, Any], step: int) -> None:
        """Send the numbers of ``data`` as the driver's values of ``step``."""
        try:
            try:
                step = as_step(step)  # numpy ints, 0-d tensors...: the producer wants an int
            except BadStep as exc:
                self._warn(f"step:{type(step).__name__}", f"{exc}: call dropped")
                return
            if step != self._step:
                self._step, self._sent = step, {}
            payload: dict[str, Any] = {}
            for name, value in data.items():
                if name in self.worker_side:
                    self._counts["worker_side"] += 1
                    continue
                if self.catalog.resolve(name).derived:  # cached: one lookup per name
                    self._counts["derived"] += 1
                    self._warn(
                        f"derived:{name}",
                        f"{name} is computed by the collector from every rank; the "
                        "framework's own value is left out",
                        logging.INFO,
                    )
                    continue
                number = as_number(value)
                if number is None:
                    self._counts["not_numeric"] += 1
                    self._warn(
                        f"type:{name}",
                        f"{name}: a {type(value).__name__} is not a single number; left out",
                        logging.DEBUG,
                    )
                    continue
                if name in self._sent:
                    if not _same(self._sent[name], number):
                        self._counts["repeated"] += 1
                        self._warn(
                            f"repeat:{name}",
                            f"{name} logged twice at step {step} with different values; the "
                            "first is kept (a driver value is one sample per step)",
                        )
                    continue
                self._sent[name] = number
                payload[name] = number
            if payload:
                self.producer.log(payload, step)
                self._counts["sent"] += len(payload)
        except Exception as exc:  # never into the training loop
            self._warn(f"error:{type(exc).__name__}", f"log() failed and was skipped: {exc!r}")

    def stats(self) -> dict[str, int]:
        return dict(self._counts)

    def _warn(self, key: str, message: str, level: int = logging.WARNING) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.log(level, "rlpulse driver stream: %s", message)


def plain(value: Any) -> Any:
    """``value`` as YAML-safe data: mappings, sequences, str, int, float, bool, None; anything
    else (enums, paths, dtypes) as its string."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in value]
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    return str(value)


def save_run_config(directory: str | Path, config: Mapping[str, Any], field: str) -> Path:
    """Write ``config`` as ``directory/config.yaml`` (beside the run's jsonl, where
    ``rlpulse compare --key`` finds it); ConfigError naming ``field`` if it cannot."""
    path = Path(directory) / RUN_CONFIG
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(plain(config), sort_keys=False))
    except OSError as exc:
        raise ConfigError(
            field, f"cannot write {path}: {exc.strerror or exc}", str(directory)
        ) from exc
    return path
