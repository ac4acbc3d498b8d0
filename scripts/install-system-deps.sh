#!/bin/sh
# Install the system packages the test suite needs; safe to run again (it does nothing then).
#
#   sudo scripts/install-system-deps.sh        # or as root in CI / a fresh Debian container
#
# Today that is the Debian `prometheus` package, which provides both `prometheus` (the server the
# Prometheus sink's integration test scrapes with) and `promtool` (which lints a live scrape),
# and `logrotate`, with which tests/integration/test_log_rotation.py rotates the collector's
# jsonl file as docs/operating.md says to.
# The package index is refreshed only when the package is not known to apt yet, recommended
# packages (node-exporter) are skipped, and the package's service is never started.
set -eu

need_prometheus() {
    ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1
}
need_logrotate() {
    ! command -v logrotate >/dev/null 2>&1 && [ ! -x /usr/sbin/logrotate ]
}

if ! need_prometheus && ! need_logrotate; then
    echo "install-system-deps: prometheus, promtool and logrotate already installed"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-system-deps: apt-get not found; install Prometheus (prometheus, promtool) by hand" >&2
    exit 1
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "install-system-deps: run as root (or install sudo) to apt-get install prometheus logrotate" >&2
        exit 1
    fi
fi

export DEBIAN_FRONTEND=noninteractive

# Never start the packaged service (it would listen on :9090): on machines without a
# policy-rc.d, put one in place for the duration of the install and take it away afterwards.
POLICY=/usr/sbin/policy-rc.d
if [ ! -e "$POLICY" ]; then
    $SUDO sh -c "printf '#!/bin/sh\nexit 101\n' > $POLICY && chmod 755 $POLICY"
    trap '$SUDO rm -f "$POLICY"' EXIT INT TERM
fi

# `apt-get update` only when the package index does not offer prometheus yet (a fresh machine,
# or a container whose lists were cleaned).
# A stale index (the mirror has moved on) shows up as a failed download: refresh once and retry.
install() {
    $SUDO apt-get install -y -qq --no-install-recommends prometheus logrotate >/dev/null
}
if ! apt-cache show prometheus >/dev/null 2>&1 || ! apt-cache show logrotate >/dev/null 2>&1; then
    $SUDO apt-get update -qq
    install
elif ! install; then
    $SUDO apt-get update -qq
    install
fi

if need_prometheus || need_logrotate; then
    echo "install-system-deps: installed, but prometheus/promtool/logrotate not found" >&2
    exit 1
fi
echo "install-system-deps: installed $(prometheus --version 2>&1 | head -n 1); logrotate"
