"""The collector's quantile of a histogram is Prometheus' own: promtool evaluates
``histogram_quantile`` over the same bucket counts (as cumulative ``le`` series) and must
find the value :func:`rlpulse.schemas.histogram.quantile` computes (without the min/max clamp,
which Prometheus does not know)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import yaml

from rlpulse.schemas.histogram import BOUNDS, INF, bound_label, bucket_counts, quantile


def test_quantile_matches_prometheus_histogram_quantile(promtool: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    cases = [
        rng.lognormal(np.log(0.03), 0.6, 400),
        rng.lognormal(np.log(2.0), 1.5, 50),  # some above the last bound (100 s)
        np.array([0.0005, 0.0005, 0.5]),  # below the first bound
    ]
    series, exprs = [], []
    for i, samples in enumerate(cases):
        counts = bucket_counts(samples)
        cumulative = np.cumsum(counts)
        for le, c in zip([*map(bound_label, BOUNDS), "+Inf"], cumulative, strict=True):
            series.append({"series": f'h_bucket{{case="{i}",le="{le}"}}', "values": f"{int(c)}x2"})
        for q in (0.5, 0.9, 0.99):
            mine = quantile(counts, q)
            assert mine is not None
            exprs.append(
                {
                    "expr": f'histogram_quantile({q}, h_bucket{{case="{i}"}})',
                    "eval_time": "1m",
                    "exp_samples": [{"labels": f'{{case="{i}"}}', "value": float(mine)}],
                }
            )
    assert INF == "inf"  # our last bucket's label; Prometheus spells it +Inf
    spec = {"tests": [{"interval": "1m", "input_series": series, "promql_expr_test": exprs}]}
    path = tmp_path / "quantiles_test.yml"
    path.write_text(yaml.safe_dump(spec))
    done = subprocess.run(
        [promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
