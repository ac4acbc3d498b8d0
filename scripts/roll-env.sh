#!/usr/bin/env bash
# The environment of the tests against real ROLL (tests/frameworks/test_roll_real.py), and their
# run. ROLL (alibaba/ROLL) is on no package registry: the registry's `roll` and `mcore-adapter`
# are unrelated projects, never installed here. Give a checkout of ROLL:
#
#   ROLL_SRC=/path/to/ROLL scripts/roll-env.sh [pytest options]
#
# It builds a virtual environment (ROLL_VENV, default /work/venvs/roll; python3.11) with torch
# (CPU, from a local wheel when one is in /opt/wheels), Ray 2.48.0 (ROLL's pin) and the packages
# ROLL imports on CPU, puts this tree and ROLL on PYTHONPATH, and runs the tests in a
# loopback-only network namespace whose default route is the loopback device: ROLL's workers
# find their IP by connecting a UDP socket towards a public address (nothing is sent).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${ROLL_SRC:?set ROLL_SRC to a checkout of alibaba/ROLL}"
venv=${ROLL_VENV:-/work/venvs/roll}
if [[ ! -x $venv/bin/python ]]; then
  python3.11 -m venv "$venv"
  wheel=$(ls /opt/wheels/torch-2.13.0+cpu-*.whl 2>/dev/null | head -1 || true)
  "$venv/bin/pip" install -q "${wheel:-torch==2.13.0}"
  "$venv/bin/pip" install -q "ray==2.48.0" "TransferQueue==0.1.6" tensordict codetiming omegaconf \
    more_itertools pybase64 psutil peft opentelemetry-api opentelemetry-sdk \
    opentelemetry-exporter-otlp opentelemetry-proto imageio requests filelock huggingface_hub \
    accelerate transformers pyzmq msgpack msgspec pyyaml pytest "numpy<2" "datasets==3.1.0" \
    "pyarrow<19" "pandas<2.3" httpx pillow
fi
# ROLL's logger writes ./output/logs under the working directory unless told otherwise.
export ROLL_LOG_DIR="${ROLL_LOG_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/roll-logs.XXXXXX")}"
export PYTHONPATH="$PWD:$ROLL_SRC" ROLL_SRC RAY_USAGE_STATS_ENABLED=0 PATH="$venv/bin:$PATH"
cmd=("$venv/bin/python" -m pytest tests/frameworks/test_roll_real.py -p no:cacheprovider "$@")
if [[ $(id -u) -eq 0 ]] && unshare -n -- true 2>/dev/null; then
  exec unshare -n -- bash -c 'ip link set lo up && ip route add default dev lo && exec "$@"' bash "${cmd[@]}"
fi
echo "(no network namespace: running plainly)" >&2
exec "${cmd[@]}"
