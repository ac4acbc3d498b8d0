"""Both tracker forms load; bad configuration fails at start-up naming the field."""

from __future__ import annotations

import pytest

from rlpulse.collector.config import CollectorConfig
from rlpulse.schemas.errors import ConfigError


def test_roll_single_tracker_form(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("track_with: tensorboard\ntracker_kwargs:\n  log_dir: /tmp/tb\n")
    config = CollectorConfig.load(path)
    assert config.trackers == {"tensorboard": {"log_dir": "/tmp/tb"}}
    assert config.bind == "tcp://127.0.0.1:5555"


def test_list_form_and_bind_override(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "track_with: [stdout, jsonl]\ntracker_kwargs:\n  jsonl: {path: o.jsonl}\ngrace_s: 5\n"
    )
    config = CollectorConfig.load(path, bind="tcp://127.0.0.1:6000")
    assert config.trackers == {"stdout": {}, "jsonl": {"path": "o.jsonl"}}
    assert (config.bind, config.grace_s) == ("tcp://127.0.0.1:6000", 5)


def test_stdout_alone_as_roll_writes_it() -> None:
    assert CollectorConfig.from_mapping({"track_with": "stdout"}).trackers == {"stdout": {}}


@pytest.mark.parametrize(
    "raw, field",
    [
        ({"bogus": 1}, "bogus"),
        ({"track_with": "nope"}, "track_with"),
        ({"track_with": ["jsonl"], "tracker_kwargs": {"stdout": {}}}, "tracker_kwargs.stdout"),
        ({"track_with": ["jsonl", "jsonl"]}, "track_with"),
        ({"track_with": 3}, "track_with"),
        ({"grace_s": -1}, "grace_s"),
        ({"grace_s": "soon"}, "grace_s"),
        ({"max_open_steps": 0}, "max_open_steps"),
        ({"bind": "localhost"}, "bind"),
        ({"track_with": ["jsonl"], "tracker_kwargs": {"jsonl": [1]}}, "tracker_kwargs.jsonl"),
    ],
)
def test_bad_config_names_the_field(raw, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        CollectorConfig.from_mapping(raw)
    assert info.value.field == field


def test_unreadable_and_invalid_yaml(tmp_path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        CollectorConfig.load(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("track_with: [stdout\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        CollectorConfig.load(bad)


def test_sink_kwargs_are_validated_when_built() -> None:
    from rlpulse.collector.sinks import build_sink
    from rlpulse.collector.sinks.base import SinkContext

    with pytest.raises(ConfigError) as info:
        build_sink("jsonl", {}, SinkContext())
    assert info.value.field == "tracker_kwargs.jsonl.path"
    with pytest.raises(ConfigError) as info:
        build_sink("stdout", {"colour": True}, SinkContext())
    assert info.value.field == "tracker_kwargs.stdout.colour"
