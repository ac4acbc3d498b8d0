"""A collector address ZeroMQ cannot connect to fails the constructor with a ConfigError that
shows the expected form (it was a raw ``ZMQError`` for an address without a scheme)."""

from __future__ import annotations

import pytest

from rlpulse.producer import Producer
from rlpulse.schemas.errors import ConfigError
from rlpulse.wire.transport import ADDRESS_FORM, check_address


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1:5555",
        "localhost",
        "tcp://127.0.0.1",
        "tcp://127.0.0.1:0",
        "tcp://:5555",
        "http://127.0.0.1:5555",
        "tcp://127.0.0.1:99999",
        "ipc://",
        "",
    ],
)
def test_a_malformed_address_is_refused_with_the_expected_form(address: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Producer(address or "tcp:/x", run="r", role="a")
    assert caught.value.field == "address"
    assert ADDRESS_FORM in str(caught.value)


@pytest.mark.parametrize(
    "address",
    ["tcp://127.0.0.1:5555", "tcp://localhost:1", "tcp://[::1]:5555", "ipc:///tmp/rlpulse.sock"],
)
def test_well_formed_addresses_pass(address: str) -> None:
    assert check_address(address) == address
