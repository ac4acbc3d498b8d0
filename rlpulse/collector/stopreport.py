"""What a stopped collector says: ``state_dir/stopped.json`` (read by
``rlpulse.collector.onray``) and the summary line in its log.

>>> # write_stop_report(Path(state_dir), final=True, open_steps=0, unwritten={}, abandoned=[],
>>> #                   health=health)
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path

from rlpulse.collector.health import Health

log = logging.getLogger("rlpulse.collector")


def write_stop_report(
    state_dir: Path,
    *,
    final: bool,
    open_steps: int,
    unwritten: Mapping[str, int],
    abandoned: list[str],
    health: Health,
    upstream_refused: int | None = None,
) -> None:
    """``stopped.json``: open steps kept for a next start, and per sink the records not
    written (a relay's ``upstream``: not acknowledged by the collector above); a relay's
    ``upstream_refused``: handshakes the collector above refused. A failure to write it is
    logged: the stop goes on."""
    report = {
        "final": final,
        "open_steps": open_steps,
        "unwritten": dict(unwritten),
        "abandoned": abandoned,
        "steps_emitted": health.steps_emitted,
        "partial_steps": health.partial_steps,
        "late": health.late,
        "producers_dropped": health.producer_dropped(),
        "incomplete_steps": health.incomplete_steps,
        **({"upstream_refused": upstream_refused} if upstream_refused is not None else {}),
    }
    path = state_dir / "stopped.json"
    try:
        path.with_suffix(".tmp").write_text(json.dumps(report))
        path.with_suffix(".tmp").replace(path)
    except OSError as exc:  # a report only: the stop goes on
        log.error("cannot write %s: %s", path, exc)


def log_stopped(h: Health, abandoned: list[str], upstream: str = "") -> None:
    """The last line a collector logs: what it received, emitted and could not apply; a
    relay's ``upstream``: what became of its link to the collector above (:func:`refusals`)."""
    log.info(
        "rlpulse collector stopped: %d messages, %d steps emitted (%d partial), %d late, "
        "%d malformed %s, %d duplicates, %d handshake failures, producers dropped %d, "
        "%d steps incomplete by a producer's word, %d entries never applied (no "
        "registration), %d steps continued from an earlier instance (%d entries it may have "
        "written too)%s",
        h.messages_received,
        h.steps_emitted,
        h.partial_steps,
        h.late,
        sum(h.malformed.values()),
        json.dumps(dict(sorted(h.malformed.items()))),
        h.duplicates,
        h.handshake_failed,
        h.producer_dropped(),
        h.incomplete_steps,
        h.unapplied,
        h.continued_steps,
        h.resent_entries,
        (f"; abandoned sinks: {', '.join(abandoned)}" if abandoned else "")
        + (f"; {upstream}" if upstream else ""),
    )


def refusals(refused: int, why: str) -> str:
    """A relay's refused handshakes, for :func:`log_stopped` ("" when none)."""
    if not refused:
        return ""
    return f"the collector above refused {refused} handshakes of this relay" + (
        f" ({why})" if why else ""
    )
