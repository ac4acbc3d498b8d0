#!/usr/bin/env bash
# Run the test suite (arguments go to pytest). As root, inside a loopback-only network
# namespace: Ray probes cloud metadata and DNS at start-up, and no test may reach outside
# this machine. Elsewhere (no root, no unshare) it runs plainly.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
export RAY_USAGE_STATS_ENABLED=0 WANDB_MODE=offline WANDB_SILENT=true PYTHONUNBUFFERED=1
if [[ $(id -u) -eq 0 ]] && command -v unshare >/dev/null && command -v ip >/dev/null \
   && unshare -n -- true 2>/dev/null; then
  echo "run-tests: in a loopback-only network namespace"
  exec unshare -n -- bash -c 'ip link set lo up && exec "$0" -m pytest "$@"' "$PY" "$@"
fi
echo "run-tests: no network namespace available (needs root and unshare); running plainly"
exec "$PY" -m pytest "$@"
