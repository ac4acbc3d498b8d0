"""Bad collector configuration that used to crash or be accepted (issue 17, item 3): each
is refused with a ConfigError that names the field and says what is wrong.

The same cases through ``python -m rlpulse.collector`` (exit status 2, no traceback), and the ones
that only show when a port is bound, are in tests/integration/test_bad_config_exit.py.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.sinks.base import SinkContext
from rlpulse.collector.sinks.prometheus import PrometheusSink
from rlpulse.schemas.errors import ConfigError


@pytest.mark.parametrize(
    "raw, field, problem",
    [
        ({"log_level": 3}, "log_level", "must be one of DEBUG"),
        ({"bind": "tcp://127.0.0.1:99999"}, "bind", "port must be from 0 to 65535"),
        ({"bind": "tcp://127.0.0.1:-1"}, "bind", "port must be from 0 to 65535"),
        ({"bind": "tcp://127.0.0.1"}, "bind", "needs a host and a port"),
        ({"sink_retries": True}, "sink_retries", "non-negative integer"),
        ({"track_with": []}, "track_with", "would discard every step"),
    ],
)
def test_bad_value_names_field_and_problem(raw: dict, field: str, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        CollectorConfig.from_mapping(raw)
    assert info.value.field == field
    assert problem in info.value.problem


@pytest.mark.parametrize("bind", ["tcp://127.0.0.1:*", "tcp://127.0.0.1:0", "tcp://[::1]:65535"])
def test_good_binds_pass(bind: str) -> None:
    assert CollectorConfig.from_mapping({"bind": bind}).bind == bind


def test_state_dir_that_is_a_file(tmp_path: Path) -> None:
    a_file = tmp_path / "state"
    a_file.write_text("")
    with pytest.raises(ConfigError) as info:
        CollectorConfig.from_mapping({"state_dir": str(a_file)})
    assert (info.value.field, info.value.problem) == ("state_dir", "is a file, not a directory")
    with pytest.raises(ConfigError) as info:
        CollectorConfig.from_mapping({"state_dir": str(a_file / "below")})
    assert info.value.field == "state_dir"
    assert "cannot be created" in info.value.problem
    # a directory still to be made is fine: the daemon creates it
    fresh = tmp_path / "new" / "state"
    assert CollectorConfig.from_mapping({"state_dir": str(fresh)}).state_dir == str(fresh)


def test_swapped_tls_files_are_named(tls_pair: tuple[Path, Path]) -> None:
    cert, key = tls_pair
    kwargs = {"port": 0, "certfile": str(key), "keyfile": str(cert)}
    with pytest.raises(ConfigError) as info:
        PrometheusSink.from_kwargs(kwargs, SinkContext())
    assert info.value.field == "tracker_kwargs.prometheus.certfile"
    assert "swapped" in info.value.problem


def test_a_certificate_without_its_key_is_refused(tls_pair: tuple[Path, Path]) -> None:
    cert, _ = tls_pair
    kwargs = {"port": 0, "certfile": str(cert), "keyfile": str(cert)}
    with pytest.raises(ConfigError) as info:
        PrometheusSink.from_kwargs(kwargs, SinkContext())
    assert info.value.field == "tracker_kwargs.prometheus.certfile"
    assert "cannot load the certificate" in info.value.problem


def test_right_tls_files_pass(tls_pair: tuple[Path, Path]) -> None:
    cert, key = tls_pair
    kwargs = {"port": 0, "certfile": str(cert), "keyfile": str(key)}
    assert PrometheusSink.from_kwargs(kwargs, SinkContext()).name == "prometheus"


def test_prometheus_port_in_use_is_a_config_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        sink = PrometheusSink.from_kwargs({"port": port}, SinkContext())
        with pytest.raises(ConfigError) as info:
            sink.open()
        sink.close()
    assert info.value.field == "tracker_kwargs.prometheus.port"
    assert "already in use" in info.value.problem
    assert info.value.value == port
