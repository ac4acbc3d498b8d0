"""``python -m rlpulse``: the ``rlpulse`` command (:mod:`rlpulse.cli`)."""

import sys

from rlpulse.cli import main

sys.exit(main())
