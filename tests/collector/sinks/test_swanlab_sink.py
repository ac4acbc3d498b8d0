"""The swanlab sink in offline mode, read back with SwanLab's own DataStoreReader and record
protos; local mode; the spellings of different SwanLab versions; and the API key."""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from swanlab.proto.swanlab.record.v1.record_pb2 import Record
from swanlab.sdk.internal.core_python.store import DataStoreReader

from rlpulse.collector.sinks import build_sink, samples_view
from rlpulse.collector.sinks.base import SinkContext
from rlpulse.collector.sinks.swanlab import SwanLabSink
from rlpulse.schemas.errors import ConfigError
from rlpulse.schemas.record import StepRecord
from tests.collector.sinks.conftest import jsonl_view, make_records, samples_record

SECRET = "sk-swanlab-test-key-0123456789"  # fake


def _read(log_dir: Path) -> tuple[Record, dict[int, dict[str, float]]]:
    """The run's start record and its scalars by step, from the run file SwanLab wrote."""
    (path,) = log_dir.glob("run-*/run-*.swanlab")
    reader = DataStoreReader()
    reader.open(path)
    start, rows = None, {}
    for raw in reader:
        record = Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "start":
            start = record.start
        elif kind == "scalar":
            rows.setdefault(record.scalar.step, {})[record.scalar.key] = record.scalar.value.number
    reader.close()
    assert start is not None
    return start, rows


def _media(log_dir: Path) -> dict[tuple[str, int], list[tuple[str, str]]]:
    """The run's texts by key and step: (caption, content read from the media file) each."""
    (path,) = log_dir.glob("run-*/run-*.swanlab")
    reader = DataStoreReader()
    reader.open(path)
    out: dict[tuple[str, int], list[tuple[str, str]]] = {}
    for raw in reader:
        record = Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "media":
            media = record.media
            out[(media.key, media.step)] = [
                (item.caption, (path.parent / "media" / "text" / item.filename).read_text())
                for item in media.value.items
            ]
    reader.close()
    return out


def _write(sink: SwanLabSink, records: list[StepRecord]) -> None:
    with ThreadPoolExecutor(1) as worker:  # as the fan-out does: one worker thread per sink
        worker.submit(sink.open).result()
        for record in records:
            worker.submit(sink.write, record).result()
        worker.submit(sink.close).result()
    sink.close()  # idempotent


@pytest.mark.parametrize(
    "spelling",
    [
        {"logdir": "sl", "experiment_name": "exp-1"},  # ROLL's (SwanLab < 0.7) spelling
        {"log_dir": "sl", "name": "exp-1"},  # SwanLab >= 0.7
    ],
)
def test_offline_logs_hold_every_step_as_jsonl_has_it(
    offline: Path, records: list[StepRecord], spelling: dict[str, str]
) -> None:
    kwargs = {"project": "rlpulse-test", "tags": ["rl"], "mode": "offline", **spelling}
    _write(build_sink("swanlab", kwargs, SinkContext(), os.environ), records)

    start, rows = _read(offline / "sl")
    assert (start.project, start.name, list(start.tags)) == ("rlpulse-test", "exp-1", ["rl"])
    expected = jsonl_view(records, offline / "out.jsonl")
    assert sorted(rows) == [0, 1, 2]
    for step, row in rows.items():
        assert row == expected[("r1", step)]  # float64 survives: exact equality


def test_mode_from_environment_and_experiment_named_after_the_run(offline: Path) -> None:
    sink = build_sink("swanlab", {"logdir": "sl"}, SinkContext(), {"SWANLAB_MODE": "offline"})
    assert sink.mode == "offline"
    _write(sink, make_records("run-7", 1))
    start, rows = _read(offline / "sl")
    assert start.name == "run-7"
    assert sorted(rows) == [0]


def test_steps_of_a_second_run_are_skipped_with_one_warning(
    offline: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sink = build_sink("swanlab", {"logdir": "sl", "mode": "offline"}, SinkContext())
    with caplog.at_level(logging.WARNING, logger="rlpulse.collector.sinks.swanlab"):
        _write(sink, [*make_records("a", 2), *make_records("b", 2)])
    assert sorted(_read(offline / "sl")[1]) == [0, 1]
    assert len([r for r in caplog.records if "'b'" in r.getMessage()]) == 1


def test_local_mode_needs_the_dashboard_or_writes_the_run(offline: Path) -> None:
    kwargs = {"logdir": "sl", "mode": "local", "project": "p"}
    if importlib.util.find_spec("swanboard") is None:
        with pytest.raises(ConfigError, match=r"pip install 'swanlab\[dashboard\]'") as err:
            SwanLabSink.from_kwargs(kwargs, SinkContext())
        assert err.value.field == "tracker_kwargs.swanlab.mode"
    else:
        _write(SwanLabSink.from_kwargs(kwargs, SinkContext()), make_records("r", 2))
        assert sorted(_read(offline / "sl")[1]) == [0, 1]


def test_cloud_and_online_are_the_same_mode() -> None:
    cloud = SwanLabSink.from_kwargs({"mode": "cloud"}, SinkContext())
    online = SwanLabSink.from_kwargs({"mode": "online"}, SinkContext())
    assert cloud.mode == online.mode == "online"  # the spelling swanlab 0.10 accepts


def test_online_key_goes_only_to_the_server_and_never_into_errors_or_logs(
    offline: Path,
    rejecting_server: tuple[str, list[tuple[str, str]]],
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    url, seen = rejecting_server
    caplog.set_level(logging.DEBUG)
    sink = build_sink(
        "swanlab",
        {"mode": "cloud", "logdir": "sl", "login_kwargs": {"host": url}},
        SinkContext(),
        {"SWANLAB_API_KEY": SECRET},
    )
    assert SECRET not in repr(sink)
    with pytest.raises(Exception) as err:  # whatever swanlab raises for a rejected key
        sink.open()
    assert [path for path, request in seen if SECRET in request], "key not sent to the server"
    texts = [str(err.value), repr(err.value), caplog.text, *capfd.readouterr()]
    texts += [p.read_text(errors="replace") for p in offline.rglob("*") if p.is_file()]
    assert not [text for text in texts if SECRET in text]


def test_config_errors_never_show_the_key() -> None:
    env = {"SWANLAB_API_KEY": SECRET}
    cases = [
        ({"login_kwargs": {"api_key": SECRET, "passwd": "x"}}, "login_kwargs.passwd"),
        ({"login_kwargs": {"api_key": [SECRET]}}, "login_kwargs.api_key"),
        ({"login_kwargs": {"api_key": SECRET}, "mode": "sideways"}, "mode"),
        ({"login_kwargs": SECRET}, "login_kwargs"),
        ({"login_kwargs": {"api_key": SECRET}, "tags": "rl"}, "tags"),
    ]
    for kwargs, field in cases:
        with pytest.raises(ConfigError) as err:
            build_sink("swanlab", kwargs, SinkContext(), env)
        assert err.value.field == f"tracker_kwargs.swanlab.{field}"
        assert SECRET not in str(err.value) and SECRET not in repr(err.value)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"logdir": "a", "log_dir": "b"}, "tracker_kwargs.swanlab.log_dir"),
        ({"experiment_name": "a", "name": "b"}, "tracker_kwargs.swanlab.name"),
        ({"project": 3}, "tracker_kwargs.swanlab.project"),
        ({"logdir": 3}, "tracker_kwargs.swanlab.logdir"),
        ({"colour": "red"}, "tracker_kwargs.swanlab.colour"),
    ],
)
def test_bad_kwargs_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        SwanLabSink.from_kwargs(kwargs, SinkContext())
    assert err.value.field == field


def test_missing_library_fails_with_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "swanlab", None)
    with pytest.raises(ConfigError, match="pip install"):
        SwanLabSink.from_kwargs({"mode": "offline"}, SinkContext())


def test_samples_are_texts_one_per_row_at_the_step(offline: Path) -> None:
    steps = [samples_record(step=0), samples_record(step=1)]
    sink = build_sink("swanlab", {"logdir": "sl", "mode": "offline"}, SinkContext())
    assert isinstance(sink, SwanLabSink)
    _write(sink, steps)
    assert sink.samples_failed == 0
    _, rows = _read(offline / "sl")
    assert rows == {r.step: dict(r.metrics) for r in steps}  # the counts stay scalars
    media = _media(offline / "sl")
    expected = {
        (samples_view.tag(name), r.step): samples_view.captioned(state)
        for r in steps
        for name, state in r.samples.items()
    }
    assert media == expected


def test_texts_swanlab_refuses_leave_the_numbers_logged(
    offline: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    sink = build_sink("swanlab", {"logdir": "sl", "mode": "offline"}, SinkContext())
    assert isinstance(sink, SwanLabSink)

    def refuse(*args: object, **kwargs: object) -> None:
        raise TypeError("no texts today")

    monkeypatch.setattr(sink._swanlab, "Text", refuse)
    record = samples_record()
    with caplog.at_level(logging.WARNING, logger="rlpulse.collector.sinks.samples_view"):
        _write(sink, [record])
    assert sink.samples_failed == 2
    assert "no texts today" in caplog.text
    assert _read(offline / "sl")[1] == {0: dict(record.metrics)}
    assert _media(offline / "sl") == {}


def test_the_runs_config_is_the_swanlab_runs_config_and_a_change_updates_it(
    offline: Path,
) -> None:
    import yaml

    config = {"actor": {"lr": 1e-6, "clip": [0.2, 0.28]}, "seed": 7}
    records = make_records("r1", 3)
    records[0] = StepRecord(**{**vars(records[0]), "config": config})
    records[2] = StepRecord(**{**vars(records[2]), "config": {"seed": 8}})
    _write(build_sink("swanlab", {"logdir": "sl", "mode": "offline"}, SinkContext()), records)
    (path,) = (offline / "sl").glob("run-*/files/config.yaml")  # what SwanLab writes and syncs
    saved = {key: entry["value"] for key, entry in yaml.safe_load(path.read_text()).items()}
    assert saved == {"actor": {"lr": 1e-6, "clip": [0.2, 0.28]}, "seed": 8}
    assert sorted(_read(offline / "sl")[1]) == [0, 1, 2]
