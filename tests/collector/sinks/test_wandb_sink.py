"""The wandb sink in offline mode: the run file is read back with wandb's own record protos, and
``wandb sync --dry-run`` must list it as a run it would upload.

wandb 0.31 has no Python reader for ``.wandb`` files any more (its internal one moved to Go), so
``_records`` walks the file's framing (the LevelDB log format: 32 KiB blocks of
crc/length/type-framed chunks after a 7-byte ``:W&B`` header) and parses each record with
``wandb.proto.wandb_internal_pb2.Record``.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from wandb.proto import wandb_internal_pb2

from rlpulse.collector.sinks import build_sink, samples_view
from rlpulse.collector.sinks.base import SinkContext
from rlpulse.collector.sinks.wandb import WandbSink
from rlpulse.schemas.errors import ConfigError
from rlpulse.schemas.record import StepRecord
from tests.collector.sinks.conftest import jsonl_view, make_records, samples_record

SECRET = "0123456789abcdef0123456789abcdef01234567"  # shaped like a wandb key; fake


def _records(path: Path) -> Iterator[wandb_internal_pb2.Record]:
    data = path.read_bytes()
    ident, _magic, _version = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0:
            break
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):  # FULL or LAST: a complete record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def _history(path: Path) -> dict[int, dict[str, float]]:
    rows = {}
    for record in _records(path):
        if record.WhichOneof("record_type") == "history":
            items = {
                item.key or "/".join(item.nested_key): json.loads(item.value_json)
                for item in record.history.item
            }
            rows[record.history.step.num] = {
                k: v for k, v in items.items() if not k.startswith("_")
            }
    return rows


def _run_info(path: Path) -> wandb_internal_pb2.RunRecord:
    return next(r.run for r in _records(path) if r.WhichOneof("record_type") == "run")


def _write(sink: WandbSink, records: list[StepRecord]) -> None:
    sink.open()
    with ThreadPoolExecutor(1) as worker:  # as the fan-out does: one worker thread per sink
        for record in records:
            worker.submit(sink.write, record).result()
        worker.submit(sink.close).result()


def test_offline_run_file_holds_every_step_as_jsonl_has_it(
    offline: Path, records: list[StepRecord]
) -> None:
    kwargs = {
        "project": "rlpulse-test",
        "name": "exp-1",
        "notes": "a note",
        "tags": ["rl", "t"],
        "mode": "offline",
        "dir": str(offline / "wb"),
    }
    _write(build_sink("wandb", kwargs, SinkContext(), os.environ), records)

    (run_file,) = (offline / "wb" / "wandb").glob("offline-run-*/run-*.wandb")
    expected = jsonl_view(records, offline / "out.jsonl")
    history = _history(run_file)
    assert sorted(history) == [0, 1, 2]
    for step, row in history.items():
        assert row == expected[("r1", step)]  # float64 survives: exact equality
    info = _run_info(run_file)
    assert (info.project, info.display_name, info.notes) == ("rlpulse-test", "exp-1", "a note")
    assert list(info.tags) == ["rl", "t"]

    dry_run = subprocess.run(
        [Path(sys.executable).with_name("wandb"), "sync", "--dry-run", str(run_file.parent)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert run_file.name in dry_run.stdout + dry_run.stderr


def test_wandb_mode_comes_from_the_environment_and_runs_get_their_own_files(
    offline: Path,
) -> None:
    sink = build_sink("wandb", {"dir": str(offline)}, SinkContext(), {"WANDB_MODE": "offline"})
    assert sink.mode == "offline"
    _write(sink, [*make_records("run-a", 2), *make_records("run-b", 1)])
    names = {}
    for path in (offline / "wandb").glob("offline-run-*/run-*.wandb"):
        names[_run_info(path).display_name] = sorted(_history(path))
    assert names == {"run-a": [0, 1], "run-b": [0]}


def test_api_key_never_appears_in_errors_logs_or_repr(
    offline: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("WANDB_API_KEY", SECRET)  # wandb reads the environment itself, too
    env = {"WANDB_API_KEY": SECRET}
    errors = []
    for kwargs in (
        {"api_key": SECRET, "mode": "sideways"},
        {"api_key": SECRET, "tags": "not-a-list"},
        {"api_key": SECRET, "project": 7},
        {"api_key": [SECRET]},
        {"api_key": SECRET, "bogus": 1},
    ):
        with pytest.raises(ConfigError) as err:
            build_sink("wandb", kwargs, SinkContext(), env)
        errors.append(err.value)
    assert [e.field.rsplit(".", 1)[1] for e in errors] == [
        "mode",
        "tags",
        "project",
        "api_key",
        "bogus",
    ]

    sink = build_sink(
        "wandb", {"mode": "offline", "dir": str(offline), "api_key": SECRET}, SinkContext(), env
    )
    _write(sink, make_records("r", 1))
    seen = [str(e) for e in errors] + [repr(e.value) for e in errors]
    seen += [repr(sink), caplog.text, *capfd.readouterr()]
    seen += [p.read_text(errors="replace") for p in (offline / "wandb").rglob("*.log")]
    assert not [text for text in seen if SECRET in text]


def test_online_key_goes_only_to_the_server_and_never_into_errors_or_logs(
    offline: Path,
    monkeypatch: pytest.MonkeyPatch,
    rejecting_server: tuple[str, list[tuple[str, str]]],
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    url, seen = rejecting_server  # a loopback server that rejects every key
    monkeypatch.delenv("WANDB_MODE")
    caplog.set_level(logging.DEBUG)
    kwargs = {"project": "p", "dir": str(offline), "api_key": SECRET, "base_url": url}
    sink = build_sink("wandb", kwargs, SinkContext(), os.environ)
    assert sink.mode == "online"
    sink.open()
    with pytest.raises(Exception) as err:  # whatever wandb raises for a rejected key
        sink.write(StepRecord(run="r", step=0, metrics={"x": 1.0}))
    sink.close()
    assert seen, "wandb never contacted the (local) server"
    texts = [str(err.value), repr(err.value), caplog.text, *capfd.readouterr()]
    texts += [p.read_text(errors="replace") for p in offline.rglob("*") if p.is_file()]
    assert not [text for text in texts if SECRET in text]


@pytest.mark.parametrize(
    ("kwargs", "environ", "field"),
    [
        ({"mode": "cloud"}, {}, "tracker_kwargs.wandb.mode"),
        ({}, {"WANDB_MODE": "nope"}, "WANDB_MODE"),
        ({"dir": 5}, {}, "tracker_kwargs.wandb.dir"),
        ({"api_key": "  "}, {}, "tracker_kwargs.wandb.api_key"),
        ({"tags": ["ok", 1]}, {}, "tracker_kwargs.wandb.tags"),
    ],
)
def test_bad_kwargs_name_the_field(kwargs: dict, environ: dict, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        build_sink("wandb", kwargs, SinkContext(), environ)
    assert err.value.field == field


def test_missing_library_fails_with_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ConfigError, match="pip install"):
        WandbSink.from_kwargs({"mode": "offline"}, SinkContext())


def test_samples_are_a_table_per_name_in_the_steps_row(offline: Path) -> None:
    steps = [samples_record(step=0), samples_record(step=1)]
    sink = build_sink("wandb", {"mode": "offline", "dir": "wb"}, SinkContext(), os.environ)
    _write(sink, steps)
    assert sink.samples_failed == 0

    (run_file,) = (offline / "wb" / "wandb").glob("offline-run-*/run-*.wandb")
    history = _history(run_file)
    assert sorted(history) == [0, 1]
    for record in steps:
        row = history[record.step]
        for name, value in record.metrics.items():
            assert row[name] == value  # the count stays the name's scalar
        for name, state in record.samples.items():
            tag = samples_view.tag(name)
            assert row[f"{tag}/_type"] == "table-file"
            assert row[f"{tag}/nrows"] == len(state.top) + len(state.bottom) + len(state.random)
            saved = json.loads((run_file.parent / "files" / row[f"{tag}/path"]).read_text())
            expected = samples_view.table(state)
            assert saved["columns"] == list(expected.columns)
            assert [tuple(r) for r in saved["data"]] == list(expected.rows)


def test_a_table_wandb_refuses_leaves_the_numbers_logged(
    offline: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    sink = build_sink("wandb", {"mode": "offline", "dir": "wb"}, SinkContext(), os.environ)
    assert isinstance(sink, WandbSink)

    def refuse(*args: object, **kwargs: object) -> None:
        raise ValueError("no tables today")

    monkeypatch.setattr(sink._wandb, "Table", refuse)
    record = samples_record()
    with caplog.at_level(logging.WARNING, logger="rlpulse.collector.sinks.samples_view"):
        _write(sink, [record])  # write() does not raise: the fan-out would retry the numbers
    assert sink.samples_failed == 2
    assert "no tables today" in caplog.text
    (run_file,) = (offline / "wb" / "wandb").glob("offline-run-*/run-*.wandb")
    assert _history(run_file) == {0: dict(record.metrics)}


def _config(path: Path) -> dict:
    """The W&B run's config as its records set it (the run's, then each update), wandb's own
    keys (``_wandb``) left out."""
    out: dict = {}
    for record in _records(path):
        kind = record.WhichOneof("record_type")
        items = record.run.config.update if kind == "run" else None
        items = record.config.update if kind == "config" else items
        for item in items or ():
            key = item.key or "/".join(item.nested_key)
            if not key.startswith("_"):
                out[key] = json.loads(item.value_json)
    return out


def test_the_runs_config_is_the_wandb_runs_config_and_a_change_updates_it(
    offline: Path,
) -> None:
    config = {"actor": {"lr": 1e-6, "clip": [0.2, 0.28]}, "seed": 7}
    records = make_records("r1", 3)
    records[0] = StepRecord(**{**vars(records[0]), "config": config})
    records[2] = StepRecord(**{**vars(records[2]), "config": {**config, "seed": 8}})
    sink = build_sink("wandb", {"mode": "offline", "dir": str(offline)}, SinkContext(), os.environ)
    _write(sink, records)
    (run_file,) = (offline / "wandb").glob("offline-run-*/run-*.wandb")
    assert _config(run_file) == {"actor": {"lr": 1e-6, "clip": [0.2, 0.28]}, "seed": 8}
    assert sorted(_history(run_file)) == [0, 1, 2]
