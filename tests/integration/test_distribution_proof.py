"""Issue 26's proof, with real processes and sockets: 1M tokens split raggedly over 8 rank
processes, 4 behind each of two relay collectors, merged by a root collector. The root's
p50/p90/p99 of ``critic/advantages`` (its jsonl) equal the quantiles of the sketch of all
the tokens (the merge across ranks and relays is exact) and agree with numpy's exact
quantiles within the catalog's stated relative error; mean, max and min are exact."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rlpulse.schemas import metrics as M, sketch as S
from tests.integration.collectors import SPAWN, relay, root, wait_for_steps
from tests.support.net import free_port

RANKS, TOKENS, STEPS = 8, 1_000_000, 2
ADV = M.CRITIC_ADVANTAGES.name


def tokens(step: int) -> tuple[np.ndarray, np.ndarray, list[list[int]]]:
    """The step's advantages, its mask, and per rank the sizes of its ``log()`` calls."""
    rng = np.random.default_rng(26 + step)
    x = np.concatenate(
        [rng.standard_t(3, TOKENS // 2), rng.lognormal(0, 2, TOKENS // 2 - 7), np.zeros(7)]
    )
    mask = rng.random(TOKENS) < 0.9
    cuts = np.sort(rng.choice(np.arange(1, TOKENS), RANKS - 1, replace=False))
    sizes = np.diff(np.concatenate([[0], cuts, [TOKENS]]))
    calls = []
    for n in sizes:
        k = int(rng.integers(1, 4))
        inner = np.sort(rng.choice(np.arange(1, n), k - 1, replace=False))
        calls.append(np.diff(np.concatenate([[0], inner, [n]])).tolist())
    return x, mask, calls


def run_rank(address: str, rank: int) -> None:
    from rlpulse.producer import Masked, Producer
    from rlpulse.producer.config import ProducerConfig

    p = Producer(
        address,
        run="proof",
        role="actor_train",
        rank=rank,
        world_size=RANKS,
        config=ProducerConfig(close_timeout_s=30),
    )
    with p:
        for step in range(STEPS):
            x, mask, calls = tokens(step)
            start = sum(sum(c) for c in calls[:rank])
            for n in calls[rank]:
                p.log({ADV: Masked(x[start : start + n], mask[start : start + n])}, step=step)
                start += n


@pytest.mark.slow
def test_a_million_tokens_over_8_rank_processes_two_relays_and_a_root(tmp_path: Path) -> None:
    top, out = root(tmp_path)
    relays = [
        relay(tmp_path, f"relay{i}", top.address, f"tcp://127.0.0.1:{free_port()}")
        for i in range(2)
    ]
    procs = [
        SPAWN.Process(target=run_rank, args=(relays[rank * 2 // RANKS].address, rank))
        for rank in range(RANKS)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(180)
        assert p.exitcode == 0
    wait_for_steps(out, "proof", STEPS, timeout_s=180)
    for r in relays:
        assert r.stop() == 0
    assert top.stop() == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    mine = [r for r in records if r["run"] == "proof"]
    assert [r["step"] for r in mine] == list(range(STEPS))
    for record in mine:
        assert not record["partial"] and record["ranks"] == RANKS
        got = record["metrics"]
        x, mask, _ = tokens(record["step"])
        sel = x[mask]
        whole = S.counts_of(sel)
        assert got[f"{ADV}/mean"] == pytest.approx(sel.mean(), rel=1e-12)
        assert (got[f"{ADV}/max"], got[f"{ADV}/min"]) == (sel.max(), sel.min())
        for q, stat in zip(S.QUANTILES, ("p50", "p90", "p99"), strict=True):
            exact = float(np.quantile(sel, q, method="inverted_cdf"))
            assert got[f"{ADV}/{stat}"] == S.quantile(whole, q, low=sel.min(), high=sel.max())
            assert abs(got[f"{ADV}/{stat}"] - exact) <= S.ALPHA * (1 + 1e-9) * abs(exact)
