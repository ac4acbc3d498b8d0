"""Distribution metrics in the sinks: the quantile scalars reach every sink as metrics; the
merged sketch (``StepRecord.distributions``) becomes a TensorBoard histogram and a cumulative
Prometheus histogram family, and survives the outbox's JSON envelope."""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlpulse.collector.sinks.base import SinkContext
from rlpulse.collector.sinks.promdist import BOUNDS, LABELS
from rlpulse.collector.sinks.prometheus import PrometheusSink
from rlpulse.collector.sinks.tensorboard import TensorBoardSink
from rlpulse.schemas import metrics as M, sketch as S
from rlpulse.schemas.record import StepRecord

ADV = M.CRITIC_ADVANTAGES.name
PROM = "rlpulse_critic_advantages"


def record(step: int, x: np.ndarray) -> StepRecord:
    """What the collector emits for a step whose ranks logged the samples ``x``."""
    counts = S.counts_of(x)
    metrics = {f"{ADV}/mean": float(x.mean()), f"{ADV}/max": float(x.max())}
    metrics[f"{ADV}/min"] = float(x.min())
    for q, stat in zip(S.QUANTILES, ("p50", "p90", "p99"), strict=True):
        metrics[f"{ADV}/{stat}"] = S.quantile(counts, q, low=x.min(), high=x.max())  # type: ignore[assignment]
    return StepRecord(
        run="r",
        step=step,
        metrics=metrics,
        roles=dict.fromkeys(metrics, "actor_train"),
        distributions={ADV: S.encode(counts)},
        time=1.0 + step,
    )


def samples(step: int) -> np.ndarray:
    return np.random.default_rng(step).normal(0.0, 2.0, 20_000)


def test_the_outbox_keeps_the_sketch_and_the_json_line_leaves_it_out() -> None:
    r = record(0, samples(0))
    assert "distributions" not in r.to_json()
    envelope = msgspec.json.decode(r.encode(seq=1))
    assert StepRecord.from_json(envelope["record"]) == r


def test_tensorboard_draws_a_histogram_per_distribution(tmp_path: Path) -> None:
    sink = TensorBoardSink.from_kwargs({"log_dir": str(tmp_path)}, SinkContext())
    sink.open()
    x = samples(0)
    sink.write(record(0, x))
    sink.close()
    acc = EventAccumulator(str(tmp_path / "r"), size_guidance={"histograms": 0, "scalars": 0})
    acc.Reload()
    assert f"{ADV}/p90" in acc.Tags()["scalars"]
    (event,) = acc.Histograms(ADV)
    h = event.histogram_value
    assert h.num == x.size and (h.min, h.max) == (x.min(), x.max())
    assert h.sum == pytest.approx(x.sum(), rel=1e-9)
    assert len(h.bucket) < 200 and sum(h.bucket) == x.size
    assert list(h.bucket_limit) == sorted(h.bucket_limit)
    # every sample lies at or below its bucket's limit, above the previous one
    limits = np.array(h.bucket_limit)
    placed = np.bincount(np.searchsorted(limits, x, side="left"), minlength=len(limits))
    assert placed.tolist() == [int(b) for b in h.bucket]


def test_prometheus_exports_a_cumulative_histogram_family() -> None:
    sink = PrometheusSink.from_kwargs({"port": 0}, SinkContext())
    try:
        steps = [samples(s) for s in range(3)]
        for s, x in enumerate(steps):
            sink.write(record(s, x))
        text = generate_latest(sink.registry).decode()
    finally:
        sink.close()
    got = {
        (s.name, s.labels.get("le")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith(PROM)
    }
    every = np.concatenate(steps)
    assert got[(f"{PROM}_count", None)] == every.size
    assert got[(f"{PROM}_sum", None)] == pytest.approx(every.sum(), rel=1e-9)
    assert got[(f"{PROM}_p90", None)] == record(2, steps[2]).metrics[f"{ADV}/p90"]
    for le, bound in zip(LABELS, (*BOUNDS, np.inf), strict=True):
        exact_at_most = float((every <= bound).sum())
        slack = float((every <= bound / S.GAMMA if bound > 0 else every <= bound * S.GAMMA).sum())
        # exact but for samples within one sketch slot (2%) below the bound
        assert slack <= got[(f"{PROM}_bucket", le)] <= exact_at_most, le
