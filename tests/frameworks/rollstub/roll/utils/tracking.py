"""Stand-in for ROLL's tracker registry: a module dict, ``create_tracker``, no ``finish()``
ever called by a pipeline."""

from typing import Any

tracker_registry: dict[str, Any] = {}


class BaseTracker:
    def log(self, values: dict, step, **kwargs) -> None:
        pass

    def finish(self) -> None:
        pass


def create_tracker(tracker_name: str, config: dict, **kwargs) -> Any:
    if not tracker_name:
        return BaseTracker()
    if tracker_name not in tracker_registry:
        raise ValueError(f"Unknown tracker name: {tracker_name}")
    return tracker_registry[tracker_name](config, **kwargs)
