"""Run tools: read a run's jsonl output (the ``jsonl`` sink's lines) after the fact.

``python -m collector report RUN.jsonl --out report.png`` draws the main curves of one run;
``python -m collector compare A.jsonl B.jsonl`` prints a table comparing runs side by side.
The command line is :mod:`runtools.cli`; the pieces are importable on their own:

>>> from runtools.runs import Run
>>> Run("r", steps=(0, 1), series={"critic/score/mean": ((0, 0.25), (1, 0.5))}).last("critic/score/mean")
0.5
"""
