"""The step ledger's buckets and its catalog entries (``ledger/...``): what
``rlpulse.schemas.ledger`` computes, named once. Part of the catalog (``rlpulse.schemas.metrics``).
"""

from __future__ import annotations

from collections.abc import Mapping

from rlpulse.schemas.catalog import Entry, Template
from rlpulse.schemas.reductions import Reduction
from rlpulse.schemas.topology import COMPUTE_REWARDS, DO_CHECKPOINT, MODEL_UPDATE, PHASES

WORK, STRAGGLER, TAIL, SYNC, REWARD, CHECKPOINT, GAPS, UNACCOUNTED = (
    "work",
    "straggler",
    "rollout_tail",
    "sync",
    "reward",
    "checkpoint",
    "gaps",
    "unaccounted",
)
BUCKETS = (WORK, STRAGGLER, TAIL, SYNC, REWARD, CHECKPOINT, GAPS, UNACCOUNTED)
"""The buckets a step's wall time is split into: they sum to it."""
OVERLAP = "overlap"
"""Stated beside the buckets, not one of them (``rlpulse.schemas.ledger``)."""
PHASE_BUCKET: Mapping[str, str] = {
    MODEL_UPDATE: SYNC,
    COMPUTE_REWARDS: REWARD,
    DO_CHECKPOINT: CHECKPOINT,
}
"""The bucket of a phase's own work on the path; phases not listed are ``work``."""
PATH_PARTS = ("execute", "onload", "offload", "straggler", "tail")

LAST = Reduction.LAST
_BY = "Computed by the collector from every rank's phase spans (docs/ledger.md)."
LEDGER_WALL = Entry(
    "ledger/wall",
    LAST,
    "s",
    f"The step's wall time: the earliest start of any rank's phase of the step to the latest "
    f"end, on the collector's timeline. {_BY}",
    derived=True,
)
LEDGER_BUCKET = Template(
    "ledger/{bucket}",
    LAST,
    "s",
    "Seconds of the step's wall time in one bucket of the step ledger: work (phases' own work "
    "on the critical path), straggler (the slowest rank of a parallel phase running alone), "
    "rollout_tail (generation after 90% of the step's responses had finished), sync "
    "(model_update), reward (compute_rewards), checkpoint (do_checkpoint), gaps (no rank in a "
    "phase of the step), unaccounted (phases' own bookkeeping); they sum to ledger/wall. "
    f"overlap (seconds in which two or more roles ran phases at once) is not in the sum. {_BY}",
    choices={"bucket": (*BUCKETS, OVERLAP)},
    derived=True,
)
LEDGER_FRACTION = Template(
    "ledger/{bucket}/fraction",
    LAST,
    "ratio",
    f"ledger/{{bucket}} over ledger/wall. {_BY}",
    choices={"bucket": (*BUCKETS, OVERLAP)},
    derived=True,
)
LEDGER_PATH = Template(
    "ledger/path/{cluster}/{phase}/{part}",
    LAST,
    "s",
    "Seconds of the step's critical path in one phase, by part: execute, onload and offload "
    "(the phase's bucket), straggler (its slowest rank alone) and tail (generation after 90% "
    f"of the step's responses had finished). {_BY}",
    choices={"phase": PHASES, "part": PATH_PARTS},
    derived=True,
)
ENTRIES = (LEDGER_WALL,)
TEMPLATES = (LEDGER_BUCKET, LEDGER_FRACTION, LEDGER_PATH)
"""The ledger's catalog entries (``rlpulse.schemas.metrics`` lists them, with attribution's)."""
