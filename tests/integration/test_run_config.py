"""A run's config through a real collector process (``Producer.run_config``): recorded once, on
the run's first step, by the jsonl and TensorBoard sinks, and not recorded again after the
collector is killed (SIGKILL) and restarted from its ``state_dir`` while the producer goes on
(its hellos carry the config again: the restored run already has it)."""

from __future__ import annotations

from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import metadata, plugin_data_pb2

from rlpulse.producer import Producer
from rlpulse.producer.config import ProducerConfig
from tests.integration.collectors import Setup

CONFIG = {"actor": {"lr": 1e-6, "clip": [0.2, 0.28]}, "algorithm": "grpo", "seed": 7}


def test_the_config_is_recorded_once_through_a_kill_and_restart(tmp_path: Path) -> None:
    tb = tmp_path / "tb"
    setup = Setup(
        tmp_path,
        track_with=["jsonl", "tensorboard"],
        tracker_kwargs={
            "jsonl": {"path": str(tmp_path / "out.jsonl")},
            "tensorboard": {"log_dir": str(tb)},
        },
    )
    daemon = setup.started()
    p = Producer(setup.bind, run="cfg", role="driver", config=ProducerConfig(close_timeout_s=30))
    try:
        assert p.run_config(CONFIG)
        for step in range(2):
            p.log({"critic/score/mean": 0.1 * step}, step=step)
        p.step_done(1)
        setup.wait_lines(2)
        daemon.kill()  # SIGKILL: what it had written and checkpointed is all it keeps
        daemon = setup.started()
        for step in range(2, 4):
            p.log({"critic/score/mean": 0.1 * step}, step=step)
    finally:
        p.close()
    setup.wait_lines(4)
    assert daemon.stop() == 0
    lines = setup.lines()
    assert [line["step"] for line in lines] == [0, 1, 2, 3]
    assert [line.get("config") for line in lines] == [CONFIG, None, None, None]
    acc = EventAccumulator(str(tb / "cfg"))
    acc.Reload()
    contents = acc.PluginTagToContent(metadata.PLUGIN_NAME)
    assert len(contents) == 1  # one session start, written before step 0
    start = plugin_data_pb2.HParamsPluginData.FromString(*contents.values()).session_start_info
    assert {k: v.WhichOneof("kind") for k, v in start.hparams.items()} == {
        "actor.lr": "number_value",
        "actor.clip": "string_value",
        "algorithm": "string_value",
        "seed": "number_value",
    }
    assert start.hparams["algorithm"].string_value == "grpo"
