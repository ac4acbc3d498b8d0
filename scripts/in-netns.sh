#!/usr/bin/env bash
# Run a command in a loopback-only network namespace when possible (root and unshare):
# Ray probes cloud metadata and DNS at start-up, and nothing we run may reach outside this
# machine. Elsewhere, run it plainly and say so.
set -euo pipefail
export RAY_USAGE_STATS_ENABLED=0 WANDB_MODE=${WANDB_MODE:-offline} WANDB_SILENT=true PYTHONUNBUFFERED=1
if [[ $(id -u) -eq 0 ]] && command -v unshare >/dev/null && command -v ip >/dev/null \
   && unshare -n -- true 2>/dev/null; then
  echo "(in a loopback-only network namespace)" >&2
  exec unshare -n -- bash -c 'ip link set lo up && exec "$@"' bash "$@"
fi
echo "(no network namespace available: needs root and unshare; running plainly)" >&2
exec "$@"
