"""Which optional extra a command needs, said in one sentence instead of a traceback.

The base install has no torch, Ray, matplotlib or FastAPI; the commands that need them
(``rlpulse report``, ``serve``, ``train``) import them late, inside :func:`needs_extra`, which
turns a missing third-party module into :class:`MissingExtra`, whose message is the pip
command. A missing ``rlpulse`` module is a bug, not an extra, and propagates unchanged.

>>> try:
...     with needs_extra("report", "rlpulse report"):
...         import no_such_module_anywhere  # noqa: F401
... except MissingExtra as exc:
...     print(exc)
rlpulse report needs no_such_module_anywhere, which is not installed: pip install 'rlpulse[report]'
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

TORCH_HINT = "pip install torch first (no extra installs it, so it never pulls a CUDA build)"


class MissingExtra(ImportError):
    """A module of an optional extra is not installed; the message says what to install.

    ``extra`` is the extra's name, ``module`` the top-level module that was missing.
    """

    def __init__(self, what: str, extra: str, module: str) -> None:
        hint = TORCH_HINT if module == "torch" else f"pip install 'rlpulse[{extra}]'"
        super().__init__(f"{what} needs {module}, which is not installed: {hint}", name=module)
        self.extra = extra
        self.module = module


@contextmanager
def needs_extra(extra: str, what: str) -> Iterator[None]:
    """Imports in this block belong to the extra ``extra`` of the command ``what``."""
    try:
        yield
    except ModuleNotFoundError as exc:
        module = (exc.name or "").split(".")[0]
        if not module or module == "rlpulse" or isinstance(exc, MissingExtra):
            raise
        raise MissingExtra(what, extra, module) from None
