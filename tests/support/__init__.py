"""Helpers the tests share, so that no test module imports another.

- :mod:`tests.support.net`: a free loopback port;
- :mod:`tests.support.waiting`: polling until a condition holds (:func:`until`,
  :func:`eventually`);
- :mod:`tests.support.prom`: parsing and scraping a Prometheus ``/metrics`` text;
- :mod:`tests.support.disk`: a small tmpfs, filled to the last byte;
- :mod:`tests.support.segments`: the records of a collector's segment file.

Fixtures live in the ``conftest.py`` files (``tls_pair`` in ``tests/conftest.py``); harnesses
of one test folder beside its tests (``tests/collector/tiers.py``,
``tests/integration/collectors.py``, ``tests/integration/trainer_runs.py``).
"""
