"""The training-overhead benchmark's verdict: a difference beyond run-to-run noise is a result."""

from __future__ import annotations

from benchmarks.overhead import summarize, verdict


def test_verdict_separates_noise_from_a_real_difference() -> None:
    assert verdict(0.005, 0.004) is True
    assert verdict(0.02, 0.004) is False
    assert verdict(0.58, 0.10) is False  # every "on" run slower than the noise explains
    assert verdict(0.05, 0.10) == "inconclusive"
    assert verdict(-0.14, 0.05) == "inconclusive"


def test_summary_reports_a_difference_beyond_noise_as_not_met() -> None:
    times = {"on": [0.264, 0.259, 0.262], "off": [0.164, 0.181, 0.170]}
    res = summarize(times, 12, ["--set", "metrics=false"], {}, {})
    assert res["met"] is False
    assert "+54" in res["measured"]
    text = "\n".join(res["markdown"])
    assert "not met" in text and "inconclusive" not in text


def test_summary_within_noise_is_inconclusive() -> None:
    times = {"on": [0.231, 0.280, 0.25], "off": [0.252, 0.298, 0.26]}
    res = summarize(times, 12, ["--set", "metrics=false"], {}, {})
    assert res["met"] == "inconclusive"
