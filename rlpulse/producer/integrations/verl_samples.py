"""verl: its validation and training generations, as ``Samples``, through the ``rlpulse``
backend.

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

The training generations of each step come from the driver's batch (:func:`train_rows`, called
by ``verl_trainer`` at the step's first update), through the same driver producer
(:meth:`ValGenerations.find` finds the live backend of a run).

>>> val_rows([("2+2=", "4", 1.0)])
[{'prompt': '2+2=', 'response': '4', 'score': 1.0}]
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Iterable
from typing import Any, ClassVar

import numpy as np

from rlpulse.producer.steps import as_step
from rlpulse.producer.values import Samples
from rlpulse.schemas import metrics as M

log = logging.getLogger("rlpulse.integrations.verl")

BACKEND = "rlpulse"
KEY = "score"
"""The field validation samples are ranked by (verl's summed reward of the response)."""
TRAIN_KEY = "reward"
"""The field training samples are ranked by: verl's score of the response (the sum of its
``token_level_scores``), named as the demo trainer's and TRL's rollout samples name it."""
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


def _masked_means(values: Any, mask: Any) -> list[float | None]:
    """Per row, the mean of ``values`` over ``mask``; None for a row with none."""
    weights = mask.double()
    counts = weights.sum(-1)
    means = (values.double() * weights).sum(-1) / counts.clamp(min=1)
    return [m if n > 0 else None for m, n in zip(means.tolist(), counts.tolist(), strict=True)]


def _texts(tokenizer: Any, ids: Any, lengths: Any, left: bool) -> list[str]:
    """Each row's tokens decoded: the last ``length`` of it (``left``: verl left-pads its
    prompts) or the first (its responses are right-padded); a token sequence that repeats (a
    prompt's ``n`` rollouts) is decoded once. Pads are special tokens: a pad inside the span
    decodes to nothing. Rows go to the tokenizer as numpy arrays, which transformers converts
    in one call each (a list it checks element by element: several times the decode)."""
    rows = np.asarray(ids.cpu())
    width = rows.shape[-1]
    spans = [rows[i, width - n :] if left else rows[i, :n] for i, n in enumerate(lengths.tolist())]
    keys = [span.tobytes() for span in spans]
    first = {key: i for i, key in reversed(list(enumerate(keys)))}
    texts = tokenizer.batch_decode([spans[i] for i in first.values()], skip_special_tokens=True)
    decoded = dict(zip(first, texts, strict=True))
    return [decoded[key] for key in keys]


def train_rows(
    batch: Any, tokenizer: Any, step: int, *, mismatch: bool
) -> tuple[list[dict[str, Any]], Any | None]:
    """One row per trained generation of verl's batch (a ``DataProto`` after the advantages),
    and the staleness of each (a tensor, or None where the rollout recorded no versions).

    A row: ``prompt`` and ``response`` (their tokens decoded, special tokens left out, as verl
    decodes its validation generations), ``reward`` (verl's score of the response, the sum of
    its ``token_level_scores``), ``advantage`` (the mean over the response's trained tokens,
    ``response_mask``), ``response_length`` (the response's tokens, as verl's
    ``response_length``); with ``mismatch``, ``logprob_mismatch`` (the mean absolute
    difference between the engine's and the trainer's log-probs of its tokens); where verl's
    rollout recorded the weights' version of each sample (``max_global_steps``),
    ``staleness``: ``step - 1 - version`` (verl updates the rollout's weights at the end of a
    step, so the freshest weights of step ``s`` are version ``s - 1``; 0 on-policy).
    """
    import torch

    t = batch.batch
    prompts, responses, attention = t["prompts"], t["responses"], t["attention_mask"]
    width = prompts.shape[-1]
    trained = t["response_mask"].bool()
    answered = attention[:, width:].bool()
    scores = t["token_level_scores"].sum(-1).tolist()
    advantages = _masked_means(t["advantages"], trained)
    lengths = answered.sum(-1).tolist()
    rows: list[dict[str, Any]] = [
        {
            "prompt": prompt,
            "response": response,
            TRAIN_KEY: float(score),
            "advantage": advantage,
            "response_length": int(length),
        }
        for prompt, response, score, advantage, length in zip(
            _texts(tokenizer, prompts, attention[:, :width].sum(-1), left=True),
            _texts(tokenizer, responses, answered.sum(-1), left=False),
            scores,
            advantages,
            lengths,
            strict=True,
        )
    ]
    keys = t.keys()  # a TensorDict has no `in` of its own
    if mismatch and "rollout_log_probs" in keys and "old_log_probs" in keys:
        diff = (t["rollout_log_probs"].double() - t["old_log_probs"].double()).abs()
        for row, value in zip(rows, _masked_means(diff, trained), strict=True):
            row["logprob_mismatch"] = value
    versions = batch.non_tensor_batch.get("max_global_steps")
    stale = None
    if versions is not None and len(versions) and all(v is not None for v in versions):
        stale = torch.as_tensor(
            step - 1 - np.asarray(versions, dtype=np.int64), dtype=torch.float64
        )
        for row, value in zip(rows, stale.tolist(), strict=True):
            row["staleness"] = int(value)
    return rows, stale


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
