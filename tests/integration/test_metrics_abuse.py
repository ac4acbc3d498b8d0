"""The /metrics port under abuse (issue 38, item 10): a real collector process, its /metrics
server attacked over loopback by many sockets at once, every load bounded in count and time.

Before (prometheus_client's server): a thread per connection without a cap, no timeout on a
request, request heads of any size, a listen backlog of 5. Now slow clients hold no thread
and are cut after ``REQUEST_TIMEOUT_S`` (counted), oversized heads are refused at
``MAX_HEAD_BYTES`` (counted), parallel scrapes wait in a deep listen queue and are all
answered, and a producer logging meanwhile is served exactly.
"""

from __future__ import annotations

import json
import selectors
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rlpulse.collector.launch import CollectorProcess
from rlpulse.collector.sinks.promhttp import MAX_HEAD_BYTES, REQUEST_TIMEOUT_S, WORKERS
from rlpulse.producer import Producer
from rlpulse.producer.config import ProducerConfig
from tests.integration.collectors import live_collector
from tests.support.prom import scrape

MB = 1024 * 1024
GET = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"


def status(pid: int, field: str) -> int:
    """``Threads`` or ``VmRSS`` (bytes) of process ``pid``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            value = int(line.split()[1])
            return value * 1024 if field == "VmRSS" else value
    raise AssertionError(field)


@contextmanager
def collector_on(tmp_path: Path) -> Iterator[tuple[CollectorProcess, int, Path]]:
    with live_collector(tmp_path) as live:
        scrape(live.port)  # serving
        yield live.collector, live.port, live.out


def log_steps(address: str, steps: int) -> None:
    with Producer(
        address, run="under-abuse", role="actor_train", config=ProducerConfig(close_timeout_s=30)
    ) as p:
        for step in range(steps):
            p.log({"abuse/value": float(step)}, step=step)


def assert_exact(out: Path, steps: int) -> None:
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["step"], r["metrics"]["abuse/value"], r["partial"]) for r in records] == [
        (s, float(s), False) for s in range(steps)
    ]


def closed_by_server(sock: socket.socket, timeout: float) -> bool:
    sock.settimeout(timeout)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def test_slow_clients_hold_no_thread_are_cut_and_counted(tmp_path) -> None:
    with collector_on(tmp_path) as (collector, port, out):
        pid = collector.proc.pid
        threads_before = status(pid, "Threads")
        slow = []
        for _ in range(300):  # connected, half a request head, then silent
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            slow.append(sock)
        opened = time.monotonic()
        try:
            time.sleep(0.5)
            threads = status(pid, "Threads")
            # before: a thread for every slow client (300 more)
            assert threads <= threads_before + WORKERS + 1, (threads_before, threads)
            started = time.monotonic()
            scrape(port)  # a whole request is answered at once, slow clients or not
            assert time.monotonic() - started < 2.0
            log_steps(collector.address, 20)  # ingestion goes on
            for sock in slow:  # every one closed by the server after the timeout
                left = opened + REQUEST_TIMEOUT_S + 5 - time.monotonic()
                assert closed_by_server(sock, max(left, 0.1)), "a slow client was kept"
        finally:
            for sock in slow:
                sock.close()
        assert scrape(port)["rlpulse_collector_http_timeouts_total"] == 300
        assert collector.stop() == 0
    assert_exact(out, 20)


def test_endless_request_heads_are_refused_at_the_limit(tmp_path) -> None:
    clients, lines = 40, 100
    line = b"X-Filler: " + b"a" * 60_000 + b"\r\n"  # under http.client's 64 kB a line
    with collector_on(tmp_path) as (collector, port, _):
        pid = collector.proc.pid
        rss_before = status(pid, "VmRSS")
        socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(clients)]
        cut: set[socket.socket] = set()
        for sock in socks:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        for _ in range(lines):  # all at once: 6 MB of head each
            for sock in socks:
                if sock in cut:
                    continue
                try:
                    sock.sendall(line)
                except OSError:  # cut off at the limit
                    cut.add(sock)
        rss_sent = status(pid, "VmRSS")
        answers = []
        for sock in socks:
            try:
                answers.append(sock.recv(200))
            except OSError:
                answers.append(b"")
            sock.close()
        time.sleep(0.5)
        rss_after = status(pid, "VmRSS")
        figures = [round(x / MB) for x in (rss_before, rss_sent, rss_after)]
        assert rss_sent - rss_before < 16 * MB and rss_after - rss_before < 16 * MB, figures
        assert sum(a.startswith(b"HTTP/1.1 431") for a in answers) >= clients // 2, answers[:3]
        assert scrape(port)["rlpulse_collector_http_oversized_total"] == clients
        assert len(line) > MAX_HEAD_BYTES


def test_a_thousand_parallel_scrapes_are_all_answered(tmp_path) -> None:
    n, deadline_s = 1000, 30.0
    with collector_on(tmp_path) as (_, port, _):
        sel = selectors.DefaultSelector()
        replies: dict[socket.socket, bytearray] = {}
        for _ in range(n):  # every connection opened at once (non-blocking connects)
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
            sel.register(sock, selectors.EVENT_WRITE)
            replies[sock] = bytearray()
        started, done, answered = time.monotonic(), 0, 0
        while done < n and time.monotonic() - started < deadline_s:
            for key, events in sel.select(0.5):
                sock = key.fileobj
                if events & selectors.EVENT_WRITE:
                    try:
                        sock.send(GET)  # connected: the whole request in one send
                    except OSError:
                        sel.unregister(sock)
                        done += 1
                        continue
                    sel.modify(sock, selectors.EVENT_READ)
                    continue
                try:
                    chunk = sock.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if chunk:
                    replies[sock] += chunk
                    continue
                sel.unregister(sock)
                done += 1
                answered += replies[sock].startswith(b"HTTP/1.0 200") or replies[sock].startswith(
                    b"HTTP/1.1 200"
                )
        for sock in replies:
            sock.close()
        took = time.monotonic() - started
        # before: a listen backlog of 5, and 370 of 1,000 scrapes timed out
        assert answered == n, f"{answered} of {n} answered in {took:.1f}s"
