"""A progress bar with the step's reward and KL (tqdm on stderr; silent when disabled)."""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType

from tqdm import tqdm


class Progress:
    """``update(summary)`` advances one step and shows score, KL and the last validation.

    >>> with Progress(2, enabled=False) as bar:
    ...     bar.update({"score": 0.5, "kl": 0.01})
    """

    def __init__(self, total: int, enabled: bool = True) -> None:
        self._bar = tqdm(
            total=total, desc="ppo", unit="step", disable=not enabled, dynamic_ncols=True
        )
        self._last_val: float | None = None

    def update(self, summary: Mapping[str, float]) -> None:
        if "val" in summary:
            self._last_val = summary["val"]
        shown = {
            "reward": f"{summary.get('score', float('nan')):.3f}",
            "kl": f"{summary.get('kl', float('nan')):.4f}",
        }
        if self._last_val is not None:
            shown["val"] = f"{self._last_val:.3f}"
        self._bar.set_postfix(shown, refresh=False)
        self._bar.update(1)

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._bar.close()
