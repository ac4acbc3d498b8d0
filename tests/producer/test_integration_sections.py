"""The fields verl's and ROLL's settings sections share (rlpulse.producer.integrations.section):
read alike, each bad value refused naming its section and field."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from rlpulse.producer.integrations.roll_settings import RollSettings
from rlpulse.producer.integrations.verl_settings import VerlSettings
from rlpulse.schemas.errors import ConfigError


def roll(section: dict[str, Any]) -> Any:
    return RollSettings.from_config({"exp_name": "r"}, section)


def verl(section: dict[str, Any]) -> Any:
    return VerlSettings.from_config({"trainer": {"rlpulse": section}}, "r")


@pytest.mark.parametrize(
    ("read", "prefix"), [(roll, "tracker_kwargs"), (verl, "rlpulse.trainer.rlpulse")]
)
def test_shared_fields_read_alike_and_bad_ones_name_their_field(
    read: Callable[[dict[str, Any]], Any], prefix: str
) -> None:
    good = read(
        {"worker_side": ["my/loss"], "config_dir": None, "producer": {"close_timeout_s": 2.0}}
    )
    assert good.worker_side[-1] == "my/loss" and good.config_dir is None
    assert good.producer.close_timeout_s == 2.0
    assert read({}).config_dir == "runs/{run}"
    for section, field in (
        ({"worker_side": "my/loss"}, "worker_side"),
        ({"config_dir": 3}, "config_dir"),
        ({"producer": {"close_timeout_s": -1}}, "producer.close_timeout_s"),
        ({"producer": {"bogus": 1}}, "producer"),
    ):
        with pytest.raises(ConfigError) as bad:
            read(section)
        assert bad.value.field == f"{prefix}.{field}", section
