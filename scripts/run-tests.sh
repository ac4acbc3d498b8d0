#!/usr/bin/env bash
# Run the test suite (arguments go to pytest) inside a loopback-only network namespace when
# possible (see in-netns.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
exec scripts/in-netns.sh .venv/bin/python -m pytest "$@"
