"""The benchmarks' fast encoder speaks exactly the producer's wire encoding (it had drifted
when metrics messages gained their sketches field, and nothing caught it)."""

from benchmarks import wire


def test_the_simulated_ranks_encode_as_the_producer_does() -> None:
    wire.self_check()
