"""``Producer.run_config``: the run's config rides in the producer's hellos, the one after the
call first; what is no plain data is left out and counted, a config too large is refused and
counted, nothing raises."""

from __future__ import annotations

import logging

from rlpulse.producer import Producer
from rlpulse.schemas import protocol, runconfig


def hellos(inbox, until) -> list[protocol.Hello]:
    messages = inbox.receive(
        timeout_s=10.0, until=lambda ms: until([m for m in ms if isinstance(m, protocol.Hello)])
    )
    return [m for m in messages if isinstance(m, protocol.Hello)]


def test_the_config_goes_out_in_a_hello_at_once_and_in_every_hello_after(inbox, caplog) -> None:
    p = Producer(inbox.address, run="r", role="driver")
    try:
        first = hellos(inbox, lambda hs: len(hs) >= 1)
        assert first[0].config == b""  # the hello before the call carries none
        with caplog.at_level(logging.WARNING, logger="rlpulse.producer"):
            assert p.run_config({"actor": {"lr": 1e-6}, "fn": print}) is True
        got = hellos(inbox, lambda hs: any(h.config for h in hs))
        sent = [h for h in got if h.config]
        assert runconfig.decode(sent[0].config) == {"actor": {"lr": 1e-6}}
        assert p.stats()["invalid"] == 1 and "left out: fn" in caplog.text
        # the periodic hello (every 5 heartbeats) repeats it: a collector that restarted
        # without its state learns it again
        again = hellos(inbox, lambda hs: sum(1 for h in hs if h.config) >= 2)
        assert sum(1 for h in again if h.config == sent[0].config) >= 2
    finally:
        p.close()


def test_a_config_too_large_or_not_a_mapping_is_refused_and_counted(inbox, caplog) -> None:
    p = Producer(inbox.address, run="r", role="driver")
    try:
        with caplog.at_level(logging.WARNING, logger="rlpulse.producer"):
            assert p.run_config({"prompt": "x" * (runconfig.MAX_BYTES + 10)}) is False
            assert p.run_config(["not", "a", "mapping"]) is False  # type: ignore[arg-type]
        assert p.stats()["invalid"] == 2
        assert "prompt (" in caplog.text and "not sent" in caplog.text
        assert "takes a mapping, not a list" in caplog.text
        p.flush(5.0)
        assert not any(h.config for h in hellos(inbox, lambda hs: len(hs) >= 1))
    finally:
        p.close()
