"""Prometheus names for every catalog metric (collector/output/promnames.py)."""

from __future__ import annotations

import re

import pytest

from rlpulse.collector.output.promnames import prom_metric, sanitize
from rlpulse.schemas.metrics import CATALOG

VALID = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")


@pytest.mark.parametrize(
    ("name", "expected", "kind", "scale"),
    [
        ("time/rollout", "rlpulse_time_rollout_seconds", "gauge", 1.0),
        (
            "time/actor_train/train_step/total",
            "rlpulse_time_actor_train_train_step_total_seconds",
            "gauge",
            1.0,
        ),
        (
            "memory/actor_train/generate/end/onload/max_allocated/0",
            "rlpulse_memory_actor_train_generate_end_onload_max_allocated_0_bytes",
            "gauge",
            2.0**30,
        ),
        (
            "memory/actor_train/generate/end/onload/max_allocated_frac/0",
            "rlpulse_memory_actor_train_generate_end_onload_max_allocated_frac_0_ratio",
            "gauge",
            1.0,
        ),
        (
            "memory/cpu/actor_train/train_step/start/rss",
            "rlpulse_memory_cpu_actor_train_train_step_start_rss_bytes",
            "gauge",
            2.0**30,
        ),
        ("system/tokens", "rlpulse_system_tokens_total", "counter", 1.0),
        ("system/samples", "rlpulse_system_samples_total", "counter", 1.0),
        ("system/tps", "rlpulse_system_tps_tokens_per_second", "gauge", 1.0),
        ("system/step_tokens", "rlpulse_system_step_tokens", "gauge", 1.0),
        ("actor/clipfrac", "rlpulse_actor_clipfrac_ratio", "gauge", 1.0),
        ("actor/valid_sample_ratio", "rlpulse_actor_valid_sample_ratio", "gauge", 1.0),
        ("actor/kl_loss", "rlpulse_actor_kl_loss_nats", "gauge", 1.0),
        ("critic/score/mean", "rlpulse_critic_score_mean", "gauge", 1.0),
        ("tokens/response_length/max", "rlpulse_tokens_response_length_max", "gauge", 1.0),
        ("actor/ratio_min", "rlpulse_actor_ratio_min", "gauge", 1.0),
        ("custom/Loss-v2.ema", "rlpulse_custom_loss_v2_ema", "gauge", 1.0),
    ],
)
def test_names_units_and_types(name: str, expected: str, kind: str, scale: float) -> None:
    metric = prom_metric(name)
    assert (metric.name, metric.kind, metric.scale) == (expected, kind, scale)
    assert name in metric.help


def test_every_catalog_name_is_valid_distinct_and_typed_by_the_catalog() -> None:
    seen: dict[tuple, str] = {}
    for name in CATALOG.output_names():
        metric = prom_metric(name)
        assert VALID.match(metric.name) and metric.name.startswith("rlpulse_"), name
        assert "__" not in metric.name and not metric.name.endswith("_"), name
        series = (metric.name, metric.labels)  # a labelled family holds several names
        assert seen.setdefault(series, name) == name, f"{name} and {seen[series]}"
        cumulative = CATALOG.resolve(name).cumulative
        assert (metric.kind == "counter") == cumulative
        assert metric.name.endswith("_total") == cumulative, name


def test_sanitize_collapses_and_strips() -> None:
    assert sanitize("//a..b--c//") == "a_b_c"
    assert sanitize("Actor/KL@max") == "actor_kl_max"
