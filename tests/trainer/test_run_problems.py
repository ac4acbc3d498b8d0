"""``RunResult.producer_problems``: every counter of lost or rejected metrics that a run's
producers report reaches it (issue 22, item 8), named by the protocol's one spelling."""

from __future__ import annotations

import pytest

from rlpulse.producer import Producer, ProducerConfig
from rlpulse.schemas.protocol import DROP_KEYS, STAT_KEYS
from rlpulse.trainer.run import producer_problems

NOBODY = "tcp://127.0.0.1:9"
"""A loopback port nothing listens on: nothing is ever acknowledged."""


def test_buffer_full_drops_of_a_real_producer_are_reported() -> None:
    producer = Producer(NOBODY, run="r", role="actor_train", config=ProducerConfig(max_unacked=5))
    for step in range(20):
        producer.log({"actor/lr": 1e-3}, step=step)
        assert not producer.flush(0.01)  # one message per call, none acknowledged
    producer.close()
    stats = producer.stats()
    # at most 5 kept for resending: the rest dropped; the kept ones lost at close
    assert stats["dropped_buffer_full"] >= 15 and stats["dropped_send"] > 0
    problems = producer_problems([stats, {"logged": 3}])
    assert problems == {k: stats[k] for k in ("dropped_buffer_full", "dropped_send")}


@pytest.mark.parametrize("key", DROP_KEYS)
def test_every_drop_counter_of_the_protocol_is_a_problem(key: str) -> None:
    assert producer_problems([{key: 2}, {key: 1}, {}]) == {key: 3}


def test_rejections_are_problems_and_traffic_is_not() -> None:
    for key in ("invalid", "nonfinite", "errors"):
        assert key in STAT_KEYS
        assert producer_problems([{key: 1}]) == {key: 1}
    traffic = {"logged": 10, "sent_messages": 10, "resent_messages": 2, "unacked": 0}
    assert producer_problems([traffic, traffic]) == {}
    assert producer_problems([dict.fromkeys(STAT_KEYS, 0)]) == {}
