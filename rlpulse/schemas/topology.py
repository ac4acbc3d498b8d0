"""The run's topology as the catalog names it: worker roles, their phases, and the metric
templates that carry a role, a phase or a device in their name.

Roles are open (a user's own worker group is a role too); the constants here are the roles
the trainer and the documentation use. Phases are closed: a phase time or memory snapshot is
defined for these phases only, ROLL's names for the work a worker does, so a misspelt phase is
caught instead of becoming a new time series.

>>> TIME_PHASE.format(cluster=ACTOR_TRAIN, phase=TRAIN_STEP, part="total")
'time/actor_train/train_step/total'
>>> TIME_PHASE.match("time/actor_train/trian_step/total") is None
True
"""

from __future__ import annotations

from rlpulse.schemas.catalog import Template
from rlpulse.schemas.reductions import Reduction

MAX, MEAN = Reduction.MAX, Reduction.MEAN

# Roles (worker groups). {cluster} in the templates below is a role.
ACTOR_TRAIN = "actor_train"
CRITIC = "critic"
REFERENCE = "reference"
ROLLOUT = "rollout"
REWARD = "reward"
DRIVER = "driver"
SERVE = "serve"  # the policy server (python -m rlpulse.trainer.serve), an external worker
ROLES = (ACTOR_TRAIN, CRITIC, REFERENCE, ROLLOUT, REWARD, DRIVER, SERVE)

# Phases: what a worker does in a step.
TRAIN_STEP = "train_step"
GENERATE = "generate"
MODEL_UPDATE = "model_update"
COMPUTE_LOG_PROBS = "compute_log_probs"
DO_CHECKPOINT = "do_checkpoint"
COMPUTE_VALUES = "compute_values"
COMPUTE_REWARDS = "compute_rewards"
PHASES = (
    TRAIN_STEP,
    GENERATE,
    MODEL_UPDATE,
    COMPUTE_LOG_PROBS,
    DO_CHECKPOINT,
    COMPUTE_VALUES,
    COMPUTE_REWARDS,
)
PARTS = ("total", "execute", "onload", "offload")
"""A phase's parts: all of it, the work itself, loading and unloading model state."""

TIME_PHASE = Template(
    "time/{cluster}/{phase}/{part}",
    MAX,
    "s",
    "Seconds a rank spent in a phase: total, the work itself (execute), and loading (onload) "
    "and unloading (offload) model state; the maximum across ranks.",
    choices={"phase": PHASES, "part": PARTS},
)
STRAGGLER = Template(
    "straggler/{cluster}/{phase}/{stat}",
    Reduction.LAST,
    "s",
    "The slowest rank of a phase in a step, from every rank's span of it (host seconds from "
    "the phase's start to its end, summed over the rank's spans of that phase in the step): "
    "lag is its time minus the median rank's, lag_ratio its time over the median's, "
    "slowest_rank its rank. Only for phases that two or more ranks ran in the step. Computed "
    "by the collector.",
    choices={"phase": PHASES, "stat": ("lag", "lag_ratio", "slowest_rank")},
    units={"stat=lag_ratio": "ratio", "stat=slowest_rank": "rank"},
    derived=True,
)
_GPU_STATS = ("allocated", "reserved", "max_allocated", "max_reserved")
_FRAC_STATS = ("max_allocated_frac", "max_reserved_frac")
MEMORY_GPU = Template(
    "memory/{cluster}/{phase}/{when}/{state}/{stat}/{device_id}",
    MAX,
    "GiB",
    "GPU memory on one worker-local device at a phase boundary (torch.cuda statistics; max_* "
    "since the phase began); the maximum across ranks. start/offload: before loading state, "
    "start/onload: after loading, end/onload: after the work, end/offload: after unloading.",
    choices={
        "phase": PHASES,
        "when": ("start", "end"),
        "state": ("offload", "onload"),
        "stat": _GPU_STATS + _FRAC_STATS,
    },
    units={"stat=max_allocated_frac": "ratio", "stat=max_reserved_frac": "ratio"},
)
MEMORY_CPU = Template(
    "memory/cpu/{cluster}/{phase}/{when}/{kind}",
    MAX,
    "GiB",
    "Resident (rss) and virtual (vms) memory of the worker process at the start and end of a "
    "phase (psutil); the maximum across ranks.",
    choices={"phase": PHASES, "when": ("start", "end"), "kind": ("rss", "vms")},
)

TIME_PHASE_GPU = Template(
    "time/{cluster}/{phase}/gpu/{part}",
    MAX,
    "s",
    "GPU seconds of a phase on the rank's current CUDA stream, between CUDA events recorded at "
    "the phase boundaries (start, after onload, before offload, end): the work the phase "
    "queued, which host time misses when the GPU runs behind the host. Read off the caller's "
    "thread, without synchronizing; the maximum across ranks. Absent without CUDA.",
    choices={"phase": PHASES, "part": PARTS},
)
GPU_DEVICE_MEMORY = Template(
    "gpu/{cluster}/{device_id}/{stat}",
    MAX,
    "GiB",
    "GPU memory as the driver reports it (NVML), read by the worker's sender thread at phase "
    "ends and every gpu_sample_s: memory_used is the whole device (CUDA contexts and other "
    "processes included), memory_total its capacity, memory_process this worker and its child "
    "processes (a vLLM engine started by the rollout worker counts here). The maximum over "
    "the step's readings and across ranks.",
    choices={"stat": ("memory_used", "memory_total", "memory_process")},
)
GPU_UTILIZATION = Template(
    "gpu/{cluster}/{device_id}/utilization",
    MEAN,
    "ratio",
    "Share of the last sample period in which a kernel ran on the device (NVML utilization), "
    "averaged over the step's readings and across ranks.",
)
GPU_POWER = Template(
    "gpu/{cluster}/{device_id}/power",
    MEAN,
    "W",
    "Board power draw (NVML), averaged over the step's readings and across ranks.",
)
GPU_TEMPERATURE = Template(
    "gpu/{cluster}/{device_id}/temperature",
    MAX,
    "celsius",
    "GPU core temperature (NVML), the maximum over the step's readings and across ranks.",
)
