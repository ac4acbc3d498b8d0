from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq

from schemas import protocol


class Inbox:
    """A ROUTER socket on a free loopback port, standing in for the collector."""

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind("tcp://127.0.0.1:*")
        self.address = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)

    def receive(self, timeout_s: float = 5.0, until=None) -> list[protocol.Message]:
        """Messages received until ``until(messages)`` holds or the timeout passes."""
        out: list[protocol.Message] = []
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        import time

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if poller.poll(50):
                _, payload = self.sock.recv_multipart()
                out.append(protocol.decode(payload))
                if until is not None and until(out):
                    break
        return out

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()


@pytest.fixture
def inbox() -> Iterator[Inbox]:
    box = Inbox()
    yield box
    box.close()


def entries(messages: list[protocol.Message]) -> list[protocol.Entry]:
    return [e for m in messages if isinstance(m, protocol.Metrics) for e in m.entries]


def has_bye(messages: list[protocol.Message]) -> bool:
    return any(isinstance(m, protocol.Bye) for m in messages)
