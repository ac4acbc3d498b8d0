#!/usr/bin/env bash
# Verify rlpulse on a GPU in one command, from the repository root, in a few minutes:
#
#   make gpu-stage               # here, with registry access: the wheels the GPU machine lacks
#   bash scripts/gpu-check.sh    # there, with .gpu-stage/ beside the checkout
#
# The GPU machine needs torch with CUDA, numpy, msgpack, psutil, nvidia-ml-py, pytest and
# hypothesis; pyzmq, msgspec and Ray come from .gpu-stage/ (installed into a folder of their
# own, nothing system-wide), unless they are already importable. The checks are
# scripts/gpu_check.py's: the gpu-marked tests under torch.cuda.set_sync_debug_mode("error"),
# two producers' CUDA tensors of every dtype merged by a real collector, NVML against
# nvidia-smi and torch.cuda, the GPU rows of the benchmarks, and a 3-step trainer run with its
# models on CUDA. Results: $GPU_CHECK_OUT/gpu-check.json (default runs/gpu-check/), and a
# summary printed last, a row per goal, met or not met. Exit 0 when every row is met, 1 when
# one is not, 2 without a CUDA device, 3 when something it needs is missing.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
STAGE=${GPU_STAGE:-.gpu-stage}
OUT_DIR=${GPU_CHECK_OUT:-runs/gpu-check}

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "gpu-check: no CUDA device here (torch in $PY sees none, or is missing), so nothing was verified" >&2
  exit 2
fi

if compgen -G "$STAGE/*.whl" >/dev/null; then
  SITE=${TMPDIR:-/tmp}/rlpulse-gpu-site
  "$PY" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --disable-pip-version-check --target "$SITE" "$STAGE"/*.whl || {
    echo "gpu-check: could not install the wheels in $STAGE/" >&2
    exit 3
  }
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  export PATH="$SITE/bin:$PATH"  # ray's own command, for Ray's workers
fi
missing=$("$PY" - <<'EOF'
import importlib.util
need = ("zmq", "msgspec", "ray", "msgpack", "psutil", "pynvml", "numpy", "pytest", "hypothesis", "yaml")
print(" ".join(n for n in need if importlib.util.find_spec(n) is None))
EOF
)
if [[ -n $missing ]]; then
  echo "gpu-check: missing Python modules: $missing (run \`make gpu-stage\` where a registry is reachable and bring $STAGE/ along)" >&2
  exit 3
fi

export RAY_USAGE_STATS_ENABLED=0 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
exec "$PY" scripts/gpu_check.py all --out "$OUT_DIR" "$@"
