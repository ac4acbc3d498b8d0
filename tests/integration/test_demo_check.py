"""``make demo`` fails when a producer's log() failed inside rlpulse: a 30-step demo once
printed "producer problems: {'errors': 58}" and exited 0. Drops and invalid values are
reported on stderr, not failed on (an overloaded machine may drop)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rlpulse.collector.health import PRODUCER_DROPPED, PRODUCER_ERRORS, PRODUCER_INVALID

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from demo import check_producers


def scrape(tmp_path: Path, errors: float, dropped: float, invalid: float) -> Path:
    path = tmp_path / "metrics.prom"
    path.write_text(
        f"{PRODUCER_ERRORS.name} {errors}\n"
        f"{PRODUCER_DROPPED.name} {dropped}\n"
        f"{PRODUCER_INVALID.name} {invalid}\n"
        "rlpulse_collector_late_entries_total 4.0\n"  # another counter: not a loss
    )
    return path


def test_a_failed_log_call_fails_the_demo(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert check_producers(scrape(tmp_path, 58.0, 0.0, 0.0)) == 1
    assert "58 log() calls that failed inside rlpulse" in capsys.readouterr().err


def test_drops_and_invalid_values_are_reported_not_failed_on(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert check_producers(scrape(tmp_path, 0.0, 2.0, 1.0)) == 0
    err = capsys.readouterr().err
    assert "2 log() calls dropped" in err and "1 values refused as invalid" in err


def test_a_clean_run_or_no_scrape_passes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert check_producers(scrape(tmp_path, 0.0, 0.0, 0.0)) == 0
    assert check_producers(tmp_path / "absent.prom") == 0
    assert capsys.readouterr().err == ""
