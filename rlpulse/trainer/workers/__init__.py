"""Ray workers by role. Each class is a plain Python class (usable in-process in tests);
:mod:`rlpulse.trainer.cluster` wraps them with ``ray.remote``. Every worker owns a
:class:`~rlpulse.producer.Producer` connected to the collector by address, and runs each unit of work
inside ``rlpulse.producer.phase("{role}/{phase}")`` with real onload/offload of its state."""
