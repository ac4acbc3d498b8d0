from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
import zmq

from rlpulse.schemas import protocol


class Inbox:
    """A ROUTER socket on a free loopback port, standing in for the collector: a background
    thread receives everything and acknowledges data messages (unless ``acking`` is off)."""

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind("tcp://127.0.0.1:*")
        self.address = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.seen: set[int] = set()
        self.acking = True
        self.messages: list[protocol.Message] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.sock.poll(20):
                continue
            ident, payload = self.sock.recv_multipart()
            msg = protocol.decode(payload)
            if isinstance(msg, protocol.Hello) and self.acking:
                # As the collector does: a hello is answered with the last number applied.
                self.sock.send_multipart(
                    [ident, protocol.encode_ack(msg.producer, max(self.seen, default=msg.seq - 1))]
                )
            if isinstance(msg, protocol.RELIABLE):
                if not self.acking:
                    self.messages.append(msg)
                    continue
                duplicate = msg.seq in self.seen
                self.seen.add(msg.seq)
                self.sock.send_multipart([ident, protocol.encode_ack(msg.producer, max(self.seen))])
                if duplicate:
                    continue  # a resend of something already received
            self.messages.append(msg)

    def receive(self, timeout_s: float = 5.0, until=None) -> list[protocol.Message]:
        """Messages received so far, once ``until(messages)`` holds or the timeout passes."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if until is not None and until(list(self.messages)):
                break
            time.sleep(0.01)
        return list(self.messages)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()
        self.ctx.term()


@pytest.fixture
def inbox() -> Iterator[Inbox]:
    box = Inbox()
    yield box
    box.close()


@dataclass(frozen=True)
class Entry:
    """One entry as the producer meant it: names resolved through its hello's tables."""

    step: int
    time: float
    names: tuple[str, ...]
    kinds: bytes
    values: np.ndarray
    """float64 (len(names), 4): sum, weight, min, max."""
    nonfinite: dict[str, int]


def entries(messages: list[protocol.Message]) -> list[Entry]:
    """Every entry of the metrics messages, with the names of the tables declared so far."""
    tables: dict[tuple[int, int], tuple[tuple[str, ...], bytes]] = {}
    out = []
    for m in messages:
        if isinstance(m, protocol.Hello):
            for decl in m.tables:
                tables[(m.producer, decl.id)] = (tuple(decl.names), decl.kinds)
        elif isinstance(m, protocol.Metrics):
            for step, t, table, values, nonfinite in m.entries:
                if isinstance(table, protocol.Table):
                    names, kinds = table.names, table.kinds
                else:
                    names, kinds = tables[(m.producer, table)]
                rows = np.frombuffer(values, dtype="<f8").reshape(len(names), 4)
                out.append(Entry(step, t, names, kinds, rows, dict(nonfinite)))
    return out


def done_steps(messages: list[protocol.Message]) -> list[int]:
    """The steps producers said they finished, in order: ``done`` messages and the ``done``
    folded into a metrics message."""
    out = []
    for m in messages:
        if isinstance(m, protocol.Done):
            out.append(m.step)
        elif isinstance(m, protocol.Metrics) and m.done >= 0:
            out.append(m.done)
    return out


def has_bye(messages: list[protocol.Message]) -> bool:
    return any(isinstance(m, protocol.Bye) for m in messages)
