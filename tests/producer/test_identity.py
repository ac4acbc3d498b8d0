"""Who a producer is: ids that seeded programs cannot make collide, names the collector
accepts, and whether it resumes its run."""

from __future__ import annotations

import random

import numpy as np
import pytest

from rlpulse.producer import Producer
from rlpulse.producer.env import resume_from_env
from rlpulse.schemas.protocol import new_producer_id


def test_producer_ids_ignore_every_seeded_generator() -> None:
    ids = set()
    for _ in range(200):
        random.seed(42)
        np.random.seed(42)
        ids.add(new_producer_id())
    assert len(ids) == 200 and all(0 <= i < 2**63 for i in ids)


def test_a_run_or_role_name_the_collector_would_refuse_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match=r"run must be a string of 1\.\.128"):
        Producer("tcp://127.0.0.1:1", run="r" * 129, role="actor_train")
    with pytest.raises(ValueError, match=r"role must be a string of 1\.\.128"):
        Producer("tcp://127.0.0.1:1", run="r", role="a" * 129)


@pytest.mark.parametrize(
    ("environ", "resume"),
    [
        ({}, False),
        ({"RLPULSE_RESUME": "1"}, True),
        ({"RLPULSE_RESUME": "true"}, True),
        ({"RLPULSE_RESUME": "0"}, False),
        ({"TORCHELASTIC_RESTART_COUNT": "0"}, False),
        ({"TORCHELASTIC_RESTART_COUNT": "2"}, True),
    ],
)
def test_resume_from_the_environment(environ: dict, resume: bool) -> None:
    assert resume_from_env(environ) is resume
