#!/usr/bin/env bash
# Run the test suite (arguments go to pytest) inside a loopback-only network namespace when
# possible (see in-netns.sh).
#
# tests/frameworks (verl and TRL) run in their own environment, .venv-integrations
# (`make install-integrations`): verl 0.9.1 pins transformers<5.11, older than the trainer's,
# so the two cannot share .venv. Without test paths both suites run, one after the other; test
# paths go to the suite they belong to. Options go to both. Without .venv-integrations, the
# integration tests run in .venv, where the verl and TRL ones skip saying why.
set -euo pipefail
cd "$(dirname "$0")/.."
INTEG=tests/frameworks
options=() main=() integ=()
for arg in "$@"; do
  case "${arg%%::*}" in
    "$INTEG" | "$INTEG"/*) integ+=("$arg") ;;
    tests | tests/) main+=("$arg"); integ+=("$INTEG") ;;
    tests/*) main+=("$arg") ;;
    *) options+=("$arg") ;;
  esac
done
if [[ ${#main[@]} -eq 0 && ${#integ[@]} -eq 0 ]]; then
  main=(--ignore="$INTEG") integ=("$INTEG")
elif [[ " ${main[*]-} " == *" tests "* || " ${main[*]-} " == *" tests/ "* ]]; then
  main+=(--ignore="$INTEG")
fi
integ_python=.venv-integrations/bin/python
if [[ ! -x $integ_python ]]; then
  echo "(no .venv-integrations: \`make install-integrations\`; verl and TRL tests will skip)" >&2
  integ_python=.venv/bin/python
fi

# pytest's 5 (no test collected) is a failure only when every suite that ran collected nothing.
codes=()
if [[ ${#main[@]} -gt 0 ]]; then
  code=0
  scripts/in-netns.sh .venv/bin/python -m pytest ${options[@]+"${options[@]}"} "${main[@]}" || code=$?
  codes+=("$code")
fi
if [[ ${#integ[@]} -gt 0 ]]; then
  code=0
  echo "== tests/frameworks in ${integ_python%/bin/python} ==" >&2
  scripts/in-netns.sh "$integ_python" -m pytest ${options[@]+"${options[@]}"} "${integ[@]}" || code=$?
  codes+=("$code")
fi
result=5
for code in "${codes[@]}"; do
  if [[ $code -ne 0 && $code -ne 5 ]]; then
    exit "$code"
  fi
  [[ $code -eq 0 ]] && result=0
done
exit "$result"
