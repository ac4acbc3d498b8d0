"""What the producer takes as a step: any integer, read once into a Python ``int``.

``log()``, ``phase(step=...)``, ``step_done()`` and the integrations' helpers all pass a step
through :func:`as_step`: a Python ``int``, a numpy integer (``for step in np.arange(n)``), a
0-d integer array or CPU tensor, anything else with ``__index__`` (``numbers.Integral``) is a
step, from 0 to :data:`~rlpulse.schemas.messages.MAX_STEP`. A float (even ``3.0``), a bool, a
string, an array or tensor of more than zero dimensions is refused: :class:`BadStep`, whose
message says why.

A 0-d tensor on a GPU is refused too, with a message that says to pass an int: its value
lives on the device, and reading it (``int(t)``, ``t.item()``) waits until the GPU has run
everything queued before it, which ``log()`` promises never to do. The training loop would
stall there at every call, with nothing to say why; a refusal is counted and warned about
once, and the fix is one ``int()`` where the loop can afford that wait, or a step counter
kept on the host. Only the tensor's device is read to tell: host metadata.

>>> import numpy as np
>>> as_step(np.int64(3)), as_step(7)
(3, 7)
>>> try:
...     as_step(3.0)
... except BadStep as exc:
...     print(exc)
step must be an integer from 0 to 4611686018427387903, got a float: 3.0
"""

from __future__ import annotations

import operator
import sys
from typing import Any

import numpy as np

from rlpulse.schemas.messages import MAX_STEP

WANT = f"step must be an integer from 0 to {MAX_STEP}"


class BadStep(ValueError):
    """A step the producer cannot take; the message says why (callers add what is dropped)."""


def as_step(value: Any) -> int:
    """``value`` as a step (see the module's docstring), or :class:`BadStep`."""
    step = value if type(value) is int else _integer(value)
    if not 0 <= step <= MAX_STEP:
        raise BadStep(f"{WANT}, got {step}")
    return step


def _integer(value: Any) -> int:
    if isinstance(value, (bool, np.bool_)):
        raise BadStep(f"{WANT}, got a bool: {value!r}")
    torch = sys.modules.get("torch")  # never imported here: a CPU-only worker pays nothing
    if torch is not None and isinstance(value, torch.Tensor):
        dtype = value.dtype
        if value.dim() != 0 or dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
            raise BadStep(f"{WANT}, got a tensor of shape {tuple(value.shape)} and dtype {dtype}")
        if value.device.type != "cpu":
            raise BadStep(
                f"{WANT}, got a tensor on {value.device}: reading its value would make log() wait "
                "for the GPU; pass an int (a step counter kept on the host, or int(step))"
            )
    if isinstance(value, np.ndarray) and value.dtype == np.bool_:
        raise BadStep(f"{WANT}, got a bool array: {value!r:.80}")
    try:
        return operator.index(value)
    except Exception:  # no __index__ (a float, a string, None), or one that fails
        what = type(value).__name__
        raise BadStep(f"{WANT}, got a {what}: {value!r:.80}") from None
