"""The real policy server (``python -m rlpulse.trainer.serve`` on a loopback port) against clients that
get things wrong (issue 22, item 14): bodies that used to crash a handler into a 500
``internal`` (deep nesting, lone surrogates, numbers too large to convert) get a 4xx naming
the problem, and connections that never finish a request are closed after
``--request-timeout-s`` instead of being held for ever."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rlpulse.schemas import serving as S
from tests.servemodel import make_checkpoint
from tests.support.net import free_port

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 1.0
"""The server's --request-timeout-s here: short, so that the tests wait little."""
MAX_CONNECTIONS = 16
"""The server's --max-connections here: small, so that a few sockets reach it."""


@dataclass
class Server:
    port: int
    proc: subprocess.Popen
    log: Path

    def request(
        self, method: str, path: str, body: bytes | None = None
    ) -> tuple[int, dict[str, Any]]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            headers = {"Content-Type": "application/json"} if body is not None else {}
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            return response.status, json.loads(response.read() or b"{}")
        finally:
            conn.close()

    def post(self, body: bytes) -> tuple[int, dict[str, Any]]:
        return self.request("POST", "/generate", body)

    def answered(self) -> dict[str, int]:
        status, health = self.request("GET", "/healthz")
        assert status == 200, health
        return health["answered"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("serve-hardening")
    checkpoint = make_checkpoint(tmp / "actor")
    port, log = free_port(), tmp / "server.log"
    cmd = [
        sys.executable,
        "-m",
        "rlpulse.trainer.serve",
        *("--model", str(checkpoint), "--port", str(port), "--device", "cpu"),
        *("--torch-threads", "1", "--request-timeout-s", str(TIMEOUT_S)),
        *("--max-connections", str(MAX_CONNECTIONS)),
    ]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    served = Server(port, proc, log)
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            served.answered()
            break
        except OSError:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
    try:
        yield served
    finally:
        proc.kill()
        proc.wait()


NESTED = b'{"prompt": ' + b"[" * 30_000 + b"]" * 30_000 + b"}"
BAD: list[tuple[str, bytes, int, str, str | None, str]] = [
    ("deep nesting", NESTED, 400, S.INVALID_JSON, None, "nests arrays or objects too deeply"),
    ("deep array", b"[" * 60_000, 400, S.INVALID_JSON, None, "too deeply"),
    (
        "lone surrogate",
        b'{"prompt": "ab\\ud800>"}',
        400,
        S.INVALID_JSON,
        "prompt",
        "lone UTF-16 surrogate ('\\ud800' at character 2)",
    ),
    (
        "low surrogate alone",
        b'{"prompt": "\\udfff"}',
        400,
        S.INVALID_JSON,
        "prompt",
        "lone UTF-16 surrogate",
    ),
    ("surrogate name", b'{"\\udc00": 1}', 400, S.INVALID_JSON, None, "lone UTF-16 surrogate"),
    (
        "5000 digits",
        b'{"prompt": "ab>", "max_new_tokens": 1' + b"0" * 5000 + b"}",
        400,
        S.INVALID_JSON,
        None,
        "number too long to parse",
    ),
    (
        "huge temperature",
        b'{"prompt": "ab>", "temperature": 1' + b"0" * 400 + b"}",
        422,
        S.OUT_OF_RANGE,
        "temperature",
        "must be from 0 (greedy) to 10",
    ),
]


@pytest.mark.parametrize(
    ("body", "status", "kind", "field", "says"),
    [case[1:] for case in BAD],
    ids=[case[0] for case in BAD],
)
def test_malformed_bodies_get_a_4xx_naming_the_problem(
    server: Server, body: bytes, status: int, kind: str, field: str | None, says: str
) -> None:
    before = server.answered()
    got, answer = server.post(body)
    assert (got, answer.get("error"), answer.get("field")) == (status, kind, field), answer
    assert says in answer["message"]
    after = server.answered()
    assert after.get(S.INTERNAL, 0) == 0, server.log.read_text()
    assert after[kind] == before.get(kind, 0) + 1  # counted as the client's error
    assert server.post(b'{"prompt": "ab>", "max_new_tokens": 2, "temperature": 0}')[0] == 200


def closed_after(sock: socket.socket) -> float:
    """Seconds until the server closes ``sock`` (reads until EOF; fails after 15 s)."""
    started = time.monotonic()
    sock.settimeout(15)
    while True:
        try:
            data = sock.recv(4096)
        except ConnectionResetError:
            break
        except TimeoutError:
            pytest.fail("the server kept a connection without a complete request for 15 s")
        if not data:
            break
    return time.monotonic() - started


@pytest.mark.parametrize(
    "partial",
    [
        b"",  # connected, then silent
        b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le",  # half a header
        b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100\r\n\r\n{"prompt": "ab',  # a body shorter than it said
    ],
    ids=["nothing", "partial headers", "partial body"],
)
def test_a_connection_without_a_whole_request_is_closed_after_the_timeout(
    server: Server, partial: bytes
) -> None:
    before = server.answered()
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(partial)
        waited = closed_after(sock)
    assert TIMEOUT_S * 0.9 <= waited <= TIMEOUT_S + 5, waited
    assert server.answered() == before  # no request: nothing answered, no error counted
    assert "no complete request in 1s" in server.log.read_text()


def test_the_timeout_bounds_receiving_a_request_not_answering_it(server: Server) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    body = b'{"prompt": "abc>", "max_new_tokens": 60, "temperature": 1.0}'
    try:
        for _ in range(2):  # one keep-alive connection, idle for more than the timeout
            conn.request("POST", "/generate", body=body)
            response = conn.getresponse()
            assert response.status == 200, response.read()
            response.read()
            time.sleep(TIMEOUT_S * 1.5)
    finally:
        conn.close()
    # a request sent in pieces, each within the timeout, is answered
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        head = (
            b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body)
        )
        sock.sendall(head)
        time.sleep(TIMEOUT_S * 0.3)
        sock.sendall(body)
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]


def test_a_bad_request_timeout_exits_2_naming_it() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rlpulse.trainer.serve", "--model", "m", "--request-timeout-s", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "request_timeout_s: must be a number of seconds from 0.05 to 3600" in done.stderr


def test_connections_beyond_the_cap_are_answered_503_and_closed_at_once(server: Server) -> None:
    """Issue 38, item 10: half-open connections had no cap (each held its socket until its
    deadline). One beyond ``--max-connections`` is answered 503 ``overloaded`` before the
    server reads anything, and closed; the server serves again once the others are gone."""
    before = server.answered()
    held = [
        socket.create_connection(("127.0.0.1", server.port), timeout=5)
        for _ in range(MAX_CONNECTIONS)
    ]
    try:
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as extra:
            reply = b""
            while chunk := extra.recv(4096):
                reply += chunk
        took = time.monotonic() - started
    finally:
        for sock in held:
            sock.close()
    assert reply.startswith(b"HTTP/1.1 503"), reply[:200]
    assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"] == S.OVERLOADED
    assert took < TIMEOUT_S  # at once, not at the deadline
    deadline = time.monotonic() + 10
    while True:  # the held ones are closed: served again
        try:
            after = server.answered()
            break
        except (OSError, AssertionError):
            assert time.monotonic() < deadline
            time.sleep(0.1)
    assert after.get(S.OVERLOADED, 0) == before.get(S.OVERLOADED, 0) + 1  # counted
    assert "refused 1 connections over max_connections (16)" in server.log.read_text()
