"""Runs and their steps: the ``aggregator`` routes each message to its ``run`` (one owner per
run: members, name table, open steps, the life of its ranks' slots). A run's parts: who it is
made of (``members``; registration and liveness in ``membership``), its names (``names``),
its open steps and their merging (``steps``, with ``sketches`` and ``spans``), and when a step
is done (``completion``)."""
