"""A producer registers the Prometheus endpoint its process serves; one made with
``logs=False`` registers only that, and logs nothing. ``rlpulse register`` holds
such a producer while a command runs."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from rlpulse.producer import Producer
from rlpulse.producer.register import main as register
from rlpulse.schemas import protocol
from tests.producer.conftest import entries, has_bye

URL = "http://127.0.0.1:8000/metrics"


def test_the_hello_carries_the_endpoint(inbox) -> None:
    p = Producer(inbox.address, run="r", role="rollout", rank=1, world_size=2, metrics_url=URL)
    p.log({"time/rollout": 1.0}, step=0)
    p.close()
    msgs = inbox.receive(until=has_bye)
    hello = msgs[0]
    assert isinstance(hello, protocol.Hello)
    assert (hello.metrics_url, hello.logs, hello.rank) == (URL, True, 1)
    assert len(entries(msgs)) == 1


def test_an_endpoint_only_producer_says_so_and_drops_log_calls(inbox) -> None:
    p = Producer(inbox.address, run="r", role="rollout", metrics_url=URL, logs=False)
    p.log({"time/rollout": 1.0}, step=0)
    p.step_done(0)
    assert p.stats()["invalid"] == 1
    p.close()
    msgs = inbox.receive(until=has_bye)
    hello = msgs[0]
    assert isinstance(hello, protocol.Hello) and (hello.metrics_url, hello.logs) == (URL, False)
    assert not any(isinstance(m, (protocol.Metrics, protocol.Done)) for m in msgs)


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"metrics_url": "10.0.0.5:8000/metrics"}, "metrics_url: metrics URL must start with"),
        ({"metrics_url": "http://u:p@h:8000/metrics"}, "credentials"),
        ({"logs": False}, "give metrics_url"),
    ],
)
def test_a_bad_endpoint_fails_at_construction_naming_it(kwargs: dict, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        Producer("tcp://127.0.0.1:1", run="r", role="rollout", **kwargs)


class Recorder:
    """Stands in for ``Producer`` in the command line: records how it was made and closed."""

    made: dict[str, Any]
    closed = False

    def __call__(self, address: str | None, **kwargs: Any) -> Recorder:
        self.made = {"address": address, **kwargs}
        return self

    def close(self) -> None:
        self.closed = True


ARGS = ["--url", URL, "--run", "r", "--role", "rollout", "--rank", "1", "--world-size", "2"]


def test_register_holds_the_endpoint_while_the_command_runs() -> None:
    made = Recorder()
    command = [sys.executable, "-c", "raise SystemExit(3)"]
    code = register([*ARGS, "--collector", "tcp://10.0.0.5:5555", "--", *command], make=made)
    assert code == 3, "the command's exit status"
    assert made.made == {
        "address": "tcp://10.0.0.5:5555",
        "run": "r",
        "role": "rollout",
        "rank": 1,
        "world_size": 2,
        "metrics_url": URL,
        "logs": False,
    }
    assert made.closed


def test_register_refuses_a_bad_url_and_a_missing_command(capsys) -> None:
    assert register(["--url", "ftp://h/", "--run", "r", "--role", "rollout"]) == 2
    assert "metrics_url" in capsys.readouterr().err
    made = Recorder()
    assert register([*ARGS, "--", "/nonexistent/engine"], make=made) == 127
    assert made.closed
