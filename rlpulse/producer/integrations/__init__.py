"""rlpulse inside the trainers people already run: verl and Hugging Face TRL.

Importing this package imports neither framework; each module imports its own only when used:

* :mod:`rlpulse.producer.integrations.verl`: ``register()`` (Ray's setup hook) adds an
  ``rlpulse`` backend to verl's ``Tracking`` (``trainer.logger=['console','rlpulse']``) and
  makes verl's loss metrics exact: its actor and critic workers log them per micro-batch
  (:mod:`rlpulse.producer.integrations.verl_loss`); times every worker call as a phase of its
  role on its rank (``verl_phases``, ``verl_trainer``) and logs each step's trained
  generations and the rollout/trainer mismatch from the driver; ``worker_producer()`` for
  metrics of your own logged exactly from inside verl's workers.
* :mod:`rlpulse.producer.integrations.trl`: ``RlpulseCallback``, a ``TrainerCallback`` for TRL's
  trainers (``GRPOTrainer`` and the rest of the ``transformers.Trainer`` family); for
  ``GRPOTrainer`` and ``RLOOTrainer`` it also logs their loss metrics exactly, per
  micro-batch, from every process (:mod:`rlpulse.producer.integrations.trl_loss`), times
  each process's generation, scoring and optimizer step, and measures a colocated vLLM
  engine (:mod:`rlpulse.producer.integrations.trl_phases`).
* :mod:`rlpulse.producer.integrations.driver`: what both share, the *driver value* policy: numbers a
  framework already reduced across ranks before logging them are sent once, by one process,
  and never merged again; :mod:`rlpulse.producer.integrations.phases`: a framework's worker
  call as a phase of its role on the rank that runs it.

>>> import rlpulse.producer.integrations  # no verl, no TRL needed
"""
