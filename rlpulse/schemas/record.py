"""What the collector emits for one step of one run: the record every sink receives.

Its JSON form (:meth:`StepRecord.to_json`) is the ``jsonl`` sink's line format, and the input
of the run tools.

>>> r = StepRecord(run="r", step=3, metrics={"critic/score/mean": 0.5}, ranks=2, time=10.0)
>>> StepRecord.from_json(r.to_json()) == r
True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from rlpulse.schemas.ledger import StepLedger
from rlpulse.schemas.samples import SampleState
from rlpulse.schemas.spans import Span

_JSON = msgspec.json.Encoder()


@dataclass(frozen=True)
class StepRecord:
    """One aggregated step.

    ``metrics`` maps reported names to values pooled over every rank that logged them.
    ``partial`` is true when an expected rank did not finish the step before it was emitted;
    ``missing`` names those ranks as ``role/rank`` (such a rank may have sent part of its data). ``ranks`` counts the producers whose data
    is in the step. ``partial`` is also true for a ``continued`` record (see there), whose
    ``missing`` may be empty: :meth:`why_partial` says why in words. ``nonfinite`` counts NaN/Inf samples producers dropped, by metric.
    ``time`` is the step's end on the producers' wall clock (the latest ``log()`` of any rank).
    ``roles`` maps each reported name to the role that logged it (several joined by ``+``);
    derived metrics have none. ``spans`` holds every rank's phases in the step
    (``rlpulse.schemas.spans``): the outbox keeps them for the timeline sinks, while the JSON line
    (:meth:`to_json`, the ``jsonl`` sink) leaves them out.
    """

    run: str
    step: int
    metrics: Mapping[str, float]
    partial: bool = False
    missing: tuple[str, ...] = ()
    continued: bool = False
    """Written by a collector without ``state_dir`` restarted mid-run: an earlier instance of
    it may have written a record of this step too, with other calls of the step (its producers
    said so: ``rlpulse.collector.runs.earlier``). This record holds only the calls that reached
    this instance; ``partial`` is set."""
    resent: tuple[str, ...] = ()
    """Of a ``continued`` record: ranks (``role/rank``) whose calls in it had been sent to the
    earlier instance, unacknowledged, and were sent again: if it had applied them, they are
    in both records."""
    ranks: int = 0
    nonfinite: Mapping[str, int] = field(default_factory=dict)
    time: float = 0.0
    roles: Mapping[str, str] = field(default_factory=dict)
    spans: tuple[Span, ...] = ()
    distributions: Mapping[str, bytes] = field(default_factory=dict)
    """Per distribution metric (``Reduction.DIST``, by its logged name), the step's merged
    quantile sketch in its wire form (``rlpulse.schemas.sketch``), for the sinks that draw
    histograms. Kept by the outbox, left out of the JSON line, as ``spans``."""
    samples: Mapping[str, SampleState] = field(default_factory=dict)
    """Per samples name (values logged as ``Samples``), the step's rows merged over every rank:
    top and bottom ``k`` by the key and a uniform random ``k`` (``rlpulse.schemas.samples``).
    The JSON line carries them readably under ``samples``; the outbox keeps their wire form."""
    config: Mapping[str, Any] = field(default_factory=dict)
    """The run's configuration (``rlpulse.schemas.runconfig``: its hyper-parameters), on the
    first step emitted after it arrived or changed (``rlpulse.collector.runs.runconfig``); empty
    on the others. The JSON line carries it under ``config``."""
    ledger: StepLedger | None = None
    """Where the step's wall time went beyond the ``ledger/...`` metrics
    (``rlpulse.schemas.ledger``): the critical path in order, who is behind each bucket, the
    cause of a slow step. The JSON line carries it under ``ledger``; None without spans."""

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "step": self.step,
            "metrics": dict(self.metrics),
            "partial": self.partial,
            "missing": list(self.missing),
            **({"continued": True, "resent": list(self.resent)} if self.continued else {}),
            "ranks": self.ranks,
            "nonfinite": dict(self.nonfinite),
            "time": self.time,
            "roles": dict(self.roles),
            **(
                {"samples": {n: s.record() for n, s in self.samples.items()}}
                if self.samples
                else {}
            ),
            **({"config": dict(self.config)} if self.config else {}),
            **({"ledger": msgspec.to_builtins(self.ledger)} if self.ledger is not None else {}),
        }

    def why_partial(self) -> str:
        """Why the record is ``partial``, in words ("" when it is not)."""
        why = [f"missing {', '.join(self.missing)}"] if self.missing else []
        if self.continued:
            why.append("continued: an earlier collector instance may have written part of it")
            if self.resent:
                why.append(f"calls of {', '.join(self.resent)} may be counted there too")
        return "; ".join(why)

    def encode(self, **extra: Any) -> bytes:
        """The JSON line of this record (floats round-trip exactly); with ``extra`` keys, the
        outbox's envelope: ``extra`` beside ``record``, which then keeps the spans too."""
        obj = self.to_json()
        if not extra:
            return _JSON.encode(obj)
        if self.spans:
            obj["spans"] = self.spans
        if self.distributions:
            obj["distributions"] = dict(self.distributions)  # bytes: base64 in JSON
        if self.samples:  # the readable rows stay; the outbox adds what rebuilds the state
            obj["samples_wire"] = {n: s.to_wire() for n, s in self.samples.items()}
        return _JSON.encode({**extra, "record": obj})

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> StepRecord:
        return cls(
            run=str(obj["run"]),
            step=int(obj["step"]),
            metrics={str(k): float(v) for k, v in obj["metrics"].items()},
            partial=bool(obj.get("partial", False)),
            missing=tuple(obj.get("missing", ())),
            continued=bool(obj.get("continued", False)),
            resent=tuple(obj.get("resent", ())),
            ranks=int(obj.get("ranks", 0)),
            nonfinite={str(k): int(v) for k, v in obj.get("nonfinite", {}).items()},
            time=float(obj.get("time", 0.0)),
            roles={str(k): str(v) for k, v in obj.get("roles", {}).items()},
            spans=tuple(msgspec.convert(obj.get("spans", ()), list[Span])),
            distributions=msgspec.convert(obj.get("distributions", {}), dict[str, bytes]),
            samples={
                str(n): SampleState.from_wire(w) for n, w in obj.get("samples_wire", {}).items()
            },
            config=dict(obj.get("config") or {}),
            ledger=msgspec.convert(obj["ledger"], StepLedger) if "ledger" in obj else None,
        )


@dataclass(frozen=True)
class RunForgotten:
    """Emitted after a run's last step when the collector forgets the run
    (``run_retention_s`` after it ended, ``rlpulse.collector.runs.retention``): each sink lets
    go of what it keeps of the run (``Sink.forget``). Never written as a step.

    >>> RunForgotten("r").encode(seq=4)
    b'{"seq":4,"forgotten":"r"}'
    """

    run: str

    def encode(self, **extra: Any) -> bytes:
        """The outbox's envelope: ``extra`` beside ``forgotten``."""
        return _JSON.encode({**extra, "forgotten": self.run})
