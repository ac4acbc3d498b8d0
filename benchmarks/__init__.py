"""rlpulse benchmarks: ``make bench`` (``python -m benchmarks.run``) writes ``RESULTS.md``.

Every benchmark measures its contenders side by side in one run, interleaved, and reports
ratios as the result and absolute figures for context: these shared machines drift too much
from run to run for an absolute number to mean much on its own.

| module | what |
|---|---|
| ``caller_cost`` | cost of one ``log()`` call in the training process vs wandb, TensorBoard, SwanLab, prometheus_client and the floor |
| ``ingest`` | collector throughput and memory as ranks x metrics grow, vs a bare ZeroMQ + msgpack floor |
| ``latency`` | last rank's ``log()`` to the step in jsonl and on ``/metrics`` |
| ``overhead`` | trainer step time with metrics streamed vs off |
| ``report`` | RESULTS.md and the plots from the raw JSON of one run |
"""
