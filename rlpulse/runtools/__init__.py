"""Run tools: read a run's jsonl output (the ``jsonl`` sink's lines) after the fact.

``rlpulse report RUN.jsonl --out report.png`` draws the main curves of one run;
``rlpulse compare A.jsonl B.jsonl`` prints a table comparing runs side by side;
``rlpulse samples RUN.jsonl`` prints a step's sample rows (the ``samples`` of its record).
The command line is :mod:`rlpulse.runtools.cli`; the pieces are importable on their own:

>>> from rlpulse.runtools.runs import Run
>>> Run("r", steps=(0, 1), series={"critic/score/mean": ((0, 0.25), (1, 0.5))}).last("critic/score/mean")
0.5
"""
