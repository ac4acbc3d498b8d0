"""verl: its validation generations, as ``Samples``, through the ``rlpulse`` backend.

verl's trainers hand the validation generations they keep, ``(input, output, score)`` per
sample, to ``ValidationGenerationsLogger.log(loggers, samples, step)``, which writes them to
each generations-capable tracker named in ``trainer.logger`` (wandb, swanlab, tensorboard...).
:func:`install` (run by ``verl.register``) makes ``"rlpulse"`` one of them: with ``rlpulse``
in ``trainer.logger``, the driver's producer (the live :class:`RlpulseBackend` of the same
project and experiment) logs

    {"val/samples": Samples([{"prompt", "response", "score"}, ...], key="score")}

at the validation's step; the collector keeps the best, worst and a uniform random few. verl
only collects them with ``trainer.log_val_generations=N`` (0, its default, logs none): it then
passes ``N`` of them, chosen at random with a fixed seed.

Never raises into verl: a failure is counted (``stats()["val_samples_failed"]``) and warned
about once.

>>> val_rows([("2+2=", "4", 1.0)])
[{'prompt': '2+2=', 'response': '4', 'score': 1.0}]
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Iterable
from typing import Any, ClassVar

from rlpulse.producer.steps import as_step
from rlpulse.producer.values import Samples
from rlpulse.schemas import metrics as M

log = logging.getLogger("rlpulse.integrations.verl")

BACKEND = "rlpulse"
KEY = "score"
"""The field validation samples are ranked by (verl's summed reward of the response)."""
_MARK = "_rlpulse_original_log"


def val_rows(samples: Iterable[Any]) -> list[dict[str, Any]]:
    """verl's ``(input, output, score)`` tuples as rows; a score that is not a number is left
    as it is (the producer drops that row and counts it)."""
    return [
        {
            "prompt": str(prompt),
            "response": str(response),
            KEY: float(score) if isinstance(score, numbers.Real) else score,
        }
        for prompt, response, score in samples
    ]


class ValGenerations:
    """The validation generations of one driver producer (an ``RlpulseBackend``'s).

    >>> # gens = ValGenerations.open("proj", "run-1", producer) ... gens.close()
    """

    live: ClassVar[dict[tuple[str, str], ValGenerations]] = {}
    """This process's open ones by (project, experiment), what ``ValidationGenerationsLogger``
    carries too."""

    def __init__(self, producer: Any) -> None:
        self.producer = producer
        self._counts = {"val_samples_logged": 0, "val_samples_failed": 0}
        self._warned = False
        self._key: tuple[str, str] | None = None

    @classmethod
    def open(cls, project: str, experiment: str, producer: Any) -> ValGenerations:
        gens = cls(producer)
        gens._key = (project, experiment)
        cls.live[gens._key] = gens
        return gens

    def close(self) -> None:
        """Stop receiving generations (safe to call twice)."""
        if self._key is not None and self.live.get(self._key) is self:
            del self.live[self._key]
        self._key = None

    @classmethod
    def find(cls, project: str | None, experiment: str | None) -> ValGenerations | None:
        """The open one of ``(project, experiment)``, else the only open one, else None."""
        found = cls.live.get((str(project), str(experiment)))
        if found is None and len(cls.live) == 1:
            (found,) = cls.live.values()
        return found

    def log(self, samples: Iterable[Any], step: int) -> None:
        """Log verl's ``(input, output, score)`` samples of ``step``; never raises."""
        try:
            rows = val_rows(samples)
            self.producer.log({M.VAL_SAMPLES.name: Samples(rows, key=KEY)}, step=as_step(step))
            self._counts["val_samples_logged"] += 1
        except Exception as exc:  # never into verl's validation
            self._counts["val_samples_failed"] += 1
            if not self._warned:
                self._warned = True
                log.warning("rlpulse: validation generations not logged as samples: %r", exc)

    def stats(self) -> dict[str, int]:
        return dict(self._counts)


def _named(loggers: Any) -> bool:
    return BACKEND in ([loggers] if isinstance(loggers, str) else list(loggers or ()))


def install() -> None:
    """Make ``"rlpulse"`` a logger of verl's ``ValidationGenerationsLogger`` (idempotent)."""
    from verl.utils.tracking import ValidationGenerationsLogger as Logger

    if _MARK in vars(Logger):
        return
    original = Logger.log

    # verl's own signature, so its callers see no difference.
    def log_generations(self: Any, loggers: Any, samples: Any, step: Any) -> None:
        try:
            gens = ValGenerations.find(self.project_name, self.experiment_name)
            if gens is not None and _named(loggers):
                gens.log(samples, step)
        except Exception as exc:  # never into verl's validation
            log.warning("rlpulse: validation generations not logged as samples: %r", exc)
        original(self, loggers, samples, step)

    setattr(Logger, _MARK, original)
    setattr(Logger, "log", log_generations)  # noqa: B010


def uninstall() -> None:
    """Undo :func:`install`."""
    from verl.utils.tracking import ValidationGenerationsLogger as Logger

    original = vars(Logger).get(_MARK)
    if original is not None:
        setattr(Logger, "log", original)  # noqa: B010
        delattr(Logger, _MARK)
