"""The demo's printed /metrics address works from the user's shell while the demo runs
(issue 17, item 5). ``make demo`` runs in a private network namespace (scripts/in-netns.sh),
whose 127.0.0.1 the shell cannot reach; the demo then prints an nsenter command instead of a
bare URL. Here a server stands in for the demo's collector, inside the same wrapper, and the
printed command is run as a user would run it."""

from __future__ import annotations

import shlex
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVER = """
import http.server, sys, threading
sys.path.insert(0, "scripts")
from demo import live_metrics_hint

class Metrics(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"rlpulse_run_step 7\\n")

    def log_message(self, *args):
        pass

server = http.server.HTTPServer(("127.0.0.1", 0), Metrics)
threading.Thread(target=server.serve_forever, daemon=True).start()
print(live_metrics_hint(f"http://127.0.0.1:{server.server_address[1]}/metrics"), flush=True)
sys.stdin.read()  # serve until the test closes stdin
"""


def test_the_printed_metrics_address_is_reachable_from_outside() -> None:
    demo = subprocess.Popen(
        ["scripts/in-netns.sh", sys.executable, "-c", SERVER],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert demo.stdout is not None
        hint = demo.stdout.readline().strip()
        url = hint.split()[0]
        if "private network namespace" not in hint:  # in-netns.sh ran it plainly
            assert hint == url
            with urllib.request.urlopen(url, timeout=10) as response:
                assert response.read() == b"rlpulse_run_step 7\n"
            return
        with pytest.raises(urllib.error.URLError):  # the bare URL: not from out here
            urllib.request.urlopen(url, timeout=5)
        command = hint.split("from another shell: ", 1)[1]
        done = subprocess.run(
            shlex.split(command), capture_output=True, text=True, timeout=30, check=False
        )
        assert (done.returncode, done.stdout) == (0, "rlpulse_run_step 7\n"), done.stderr
    finally:
        demo.communicate(timeout=30)
    assert demo.returncode == 0
