"""The TensorBoard sink, read back with TensorBoard's own EventAccumulator."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util

from rlpulse.collector.sinks import samples_view
from rlpulse.collector.sinks.base import SinkContext
from rlpulse.collector.sinks.tensorboard import TensorBoardSink
from rlpulse.schemas.errors import ConfigError
from rlpulse.schemas.record import StepRecord
from rlpulse.schemas.samples import reduce_rows
from tests.collector.sinks.conftest import jsonl_view, make_records, samples_record


def _write(log_dir: Path, records: list[StepRecord]) -> None:
    sink = TensorBoardSink.from_kwargs({"log_dir": str(log_dir)}, SinkContext())
    sink.open()
    # The fan-out calls a sink from its own worker thread: do the same.
    with ThreadPoolExecutor(1) as worker:
        for record in records:
            worker.submit(sink.write, record).result()
    sink.close()
    sink.close()  # idempotent


def _read(run_dir: Path) -> EventAccumulator:
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return acc


def test_event_accumulator_reads_every_metric_as_a_scalar_equal_to_jsonl(
    tmp_path: Path, records: list[StepRecord]
) -> None:
    _write(tmp_path / "tb", records)
    expected = jsonl_view(records, tmp_path / "out.jsonl")

    acc = _read(tmp_path / "tb" / "r1")
    assert sorted(acc.Tags()["scalars"]) == sorted(records[0].metrics)
    for tag in acc.Tags()["scalars"]:
        events = acc.Scalars(tag)
        assert [e.step for e in events] == [0, 1, 2]
        for event in events:
            # TensorBoard scalars are float32: equal to the jsonl value rounded to float32.
            assert event.value == float(np.float32(expected[("r1", event.step)][tag])), tag
    wall = [e.wall_time for e in acc.Scalars("time/rollout")]
    assert wall == [r.time for r in records]


def test_each_run_gets_its_own_directory(tmp_path: Path) -> None:
    mixed = [*make_records("run/a", 2), *make_records("b", 1)]
    _write(tmp_path, mixed)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "run_a"]
    assert [e.step for e in _read(tmp_path / "run_a").Scalars("time/rollout")] == [0, 1]
    assert [e.step for e in _read(tmp_path / "b").Scalars("time/rollout")] == [0]


def test_reopening_appends_a_new_event_file(tmp_path: Path) -> None:
    _write(tmp_path, make_records("r", 2))
    _write(tmp_path, [StepRecord(run="r", step=2, metrics={"time/rollout": 9.0})])
    assert len(list((tmp_path / "r").glob("events.out.tfevents.*"))) == 2
    assert [e.step for e in _read(tmp_path / "r").Scalars("time/rollout")] == [0, 1, 2]


def test_the_collector_with_a_tensorboard_sink_does_not_import_torch(tmp_path: Path) -> None:
    # In a fresh interpreter: other tests in this process import torch themselves.
    script = (
        "import sys\n"
        "from rlpulse.collector.daemon import Collector\n"
        "from rlpulse.collector.config import CollectorConfig\n"
        "from rlpulse.schemas.record import StepRecord\n"
        f"c = CollectorConfig.from_mapping({{'bind': 'tcp://127.0.0.1:*', 'track_with': 'tensorboard', "
        f"'tracker_kwargs': {{'log_dir': {str(tmp_path)!r}}}}})\n"
        "col = Collector(c)\n"
        "from rlpulse.schemas.samples import reduce_rows\n"
        "s = {'x': reduce_rows([{'reward': 1.0, 'response': 'r'}], 'reward', origin=('a', 0))}\n"
        "col.fanout.start(); col.fanout.put(StepRecord(run='r', step=0, metrics={'x': 1.0}, samples=s)); col.close()\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "False"
    assert [e.step for e in _read(tmp_path / "r").Scalars("x")] == [0]
    assert [e.step for e in _read(tmp_path / "r").Tensors("samples/x")] == [0]


def test_samples_are_a_markdown_text_summary_per_name(tmp_path: Path) -> None:
    steps = [samples_record(step=0), samples_record(step=1)]
    _write(tmp_path, steps)
    acc = _read(tmp_path / "r1")
    names = sorted(samples_view.tag(n) for n in steps[0].samples)
    assert sorted(acc.PluginTagToContent("text")) == names  # TensorBoard's Text tab shows them
    assert sorted(acc.Tags()["scalars"]) == sorted(steps[0].metrics)  # the counts stay scalars
    for name in steps[0].samples:
        events = acc.Tensors(samples_view.tag(name))
        assert [e.step for e in events] == [0, 1]
        for event, record in zip(events, steps, strict=True):
            (text,) = event.tensor_proto.string_val
            assert text.decode() == samples_view.markdown(name, record.samples[name])
            assert event.wall_time == record.time


@pytest.mark.filterwarnings("ignore:html5lib.s sanitizer is deprecated:DeprecationWarning")
def test_tensorboards_text_tab_renders_one_table_row_per_sample(tmp_path: Path) -> None:
    from tensorboard.plugins.text.text_plugin import text_array_to_html  # warns on import

    rows = [
        {"response": "<think>a | b</think>\nso 4", "reward": 1.0},
        {"response": "x" * 3000, "reward": 0.0},
    ]
    samples = {"rollout/samples": reduce_rows(rows, "reward", origin=("actor", 0))}
    _write(
        tmp_path, [StepRecord(run="r", step=0, metrics={"rollout/samples": 2.0}, samples=samples)]
    )
    (event,) = _read(tmp_path / "r").Tensors("samples/rollout/samples")
    page = text_array_to_html(tensor_util.make_ndarray(event.tensor_proto), True)
    # Two sets of two rows and the random two; columns set, role, rank, response, reward.
    assert page.count("<tr>") == 1 + 6 and page.count("<td>") == 6 * 5
    assert "<td>&lt;think&gt;a | b&lt;/think&gt;<br />so 4</td>" in page.replace("<br>", "<br />")
    assert "x" * 1000 + "…[+2000]</td>" in page  # cut for display, saying how much


def test_a_table_that_cannot_be_made_leaves_the_scalars_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(name: str, state: object, limit: int = 0) -> str:
        raise UnicodeError("cannot render")

    monkeypatch.setattr(samples_view, "markdown", broken)
    sink = TensorBoardSink.from_kwargs({"log_dir": str(tmp_path)}, SinkContext())
    sink.open()
    sink.write(samples_record())  # does not raise: a retry would write the scalars twice
    sink.close()
    assert sink.samples_failed == 2
    acc = _read(tmp_path / "r1")
    assert [e.step for e in acc.Scalars("time/rollout")] == [0]
    assert acc.Tags()["tensors"] == []


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({}, "tracker_kwargs.tensorboard.log_dir"),
        ({"log_dir": 3}, "tracker_kwargs.tensorboard.log_dir"),
        ({"log_dir": "x", "flush_secs": 10}, "tracker_kwargs.tensorboard.flush_secs"),
    ],
)
def test_bad_kwargs_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        TensorBoardSink.from_kwargs(kwargs, SinkContext())
    assert err.value.field == field


def test_log_dir_that_is_a_file_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(ConfigError, match="not a directory"):
        TensorBoardSink.from_kwargs({"log_dir": str(tmp_path / "f")}, SinkContext())


def test_missing_library_fails_with_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard.compat.proto", None)
    with pytest.raises(ConfigError, match="pip install"):
        TensorBoardSink.from_kwargs({"log_dir": "x"}, SinkContext())


def test_the_runs_config_is_its_hparams_as_tensorboards_reader_sees_them(tmp_path: Path) -> None:
    """The config on a step is written as the HParams plugin's session start (what
    ``add_hparams`` writes), read back with EventAccumulator and the plugin's own proto."""
    from tensorboard.plugins.hparams import metadata, plugin_data_pb2

    config = {"actor": {"lr": 1e-6, "clip": [0.2, 0.28]}, "seed": 7, "fsdp": True, "tag": None}
    records = make_records("r1", 2)
    records[0] = StepRecord(**{**vars(records[0]), "config": config})
    _write(tmp_path / "tb", records)
    acc = _read(tmp_path / "tb" / "r1")
    (content,) = acc.PluginTagToContent(metadata.PLUGIN_NAME).values()
    start = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    got = {k: getattr(v, v.WhichOneof("kind")) for k, v in start.hparams.items()}
    assert got == {
        "actor.lr": pytest.approx(1e-6),
        "actor.clip": "[0.2, 0.28]",
        "seed": 7.0,
        "fsdp": True,
        "tag": "null",
    }
    assert start.group_name == "r1"
    assert sorted(acc.Tags()["scalars"]) == sorted(records[0].metrics)  # the steps as before
