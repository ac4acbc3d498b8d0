"""TRL: the completions ``GRPOTrainer`` (and ``RLOOTrainer``) already hold, as ``Samples``.

After scoring a generation batch, TRL keeps its prompts, completions, per-function rewards and
advantages in ``trainer._logs`` (what ``log_completions`` prints and sends to wandb), filled
whether or not ``log_completions`` is set. TRL has gathered them over the processes already:
every process holds the whole batch, process ``r``'s ``n`` rows at ``[r * n, (r + 1) * n)`` of
the chunk just appended. :class:`SamplesHook` wraps ``_generate_and_score_completions`` on the
trainer object and, after each training generation, logs this process's own rows (no gather of
its own, and no row twice: the collector merges the ranks' rows, each with its rank) as

    {"rollout/samples": Samples(rows, key="reward")}

for the optimizer step that first trains on them (``global_step + 1``, as the loss hook's).
A row is ``prompt``, ``response`` (TRL's completion; a conversation is written one
``role: content`` line per message), ``reward`` (the weighted sum of the reward functions, as
TRL's ``reward`` metric; None when every function returned None), ``advantage`` and
``rewards/<function>`` per reward function. Evaluation generations are not logged.

A failure (another TRL's ``_logs`` layout) never reaches the training step: it is counted
(``stats()["samples_failed"]``) and warned about once.

>>> SamplesHook.fits(object())
False
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

from rlpulse.producer.values import Samples
from rlpulse.schemas import metrics as M

log = logging.getLogger("rlpulse.integrations.trl")

KEY = "reward"
"""The field rollout samples are ranked by."""
Row = dict[str, str | float | None]


def text(value: Any) -> str:
    """A prompt or completion as text: a string as it is, a conversation (TRL's list of
    ``{"role", "content"}`` messages) one ``role: content`` line per message."""
    if isinstance(value, str):
        return value
    if isinstance(value, Sequence) and all(isinstance(m, dict) for m in value):
        return "\n".join(f"{m.get('role', '?')}: {m.get('content', '')}" for m in value)
    return str(value)


def _number(value: Any) -> float | None:
    number = float(value)
    return None if math.isnan(number) else number


def rows(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    rewards: dict[str, Sequence[float]],
    weights: Sequence[float],
    advantages: Sequence[float],
) -> list[Row]:
    """One row per completion, from TRL's own columns (``rewards``: function name -> values,
    NaN where the function gave none; ``weights``: TRL's ``reward_weights``, in that order).

    >>> rows(["2+2="], ["4"], {"exact": [1.0], "short": [float("nan")]}, [1.0, 0.5], [0.7])
    [{'prompt': '2+2=', 'response': '4', 'reward': 1.0, 'advantage': 0.7, \
'rewards/exact': 1.0, 'rewards/short': None}]
    """
    out: list[Row] = []
    names = list(rewards)
    for i, (prompt, completion, advantage) in enumerate(
        zip(prompts, completions, advantages, strict=True)
    ):
        per_function = {name: _number(rewards[name][i]) for name in names}
        scored = [
            (w, r) for w, r in zip(weights, per_function.values(), strict=True) if r is not None
        ]
        row: Row = {
            "prompt": text(prompt),
            "response": text(completion),
            KEY: math.fsum(w * r for w, r in scored) if scored else None,
            "advantage": _number(advantage),
        }
        row.update({f"rewards/{name}": value for name, value in per_function.items()})
        out.append(row)
    return out


class SamplesHook:
    """Logs each training generation's rows of this process (see the module text).

    >>> # detach = SamplesHook(producer).attach(trainer) ... detach()
    """

    def __init__(self, producer: Any, name: str = M.ROLLOUT_SAMPLES.name) -> None:
        self.producer = producer
        self.name = name
        self._counts = {"samples_logged": 0, "samples_failed": 0}
        self._warned = False

    @staticmethod
    def fits(trainer: Any) -> bool:
        """Whether ``trainer`` keeps TRL's completion logs (GRPO, RLOO)."""
        logs = getattr(trainer, "_logs", None)
        return (
            callable(getattr(trainer, "_generate_and_score_completions", None))
            and isinstance(logs, dict)
            and {"prompt", "completion", "rewards", "advantages"} <= logs.keys()
        )

    def stats(self) -> dict[str, int]:
        return dict(self._counts)

    def attach(self, trainer: Any) -> Callable[[], None]:
        """Wrap ``trainer._generate_and_score_completions`` on the instance (the class is
        untouched); returns the function that undoes it."""
        original = trainer._generate_and_score_completions

        def generate_and_score(inputs: Any, *args: Any, **kwargs: Any) -> Any:
            out = original(inputs, *args, **kwargs)
            if trainer.model.training:
                self.log(trainer, len(inputs))
            return out

        trainer._generate_and_score_completions = generate_and_score

        def detach() -> None:
            trainer.__dict__.pop("_generate_and_score_completions", None)

        return detach

    def log(self, trainer: Any, n: int) -> None:
        """Log this process's ``n`` rows of the chunk TRL just appended to ``_logs``."""
        try:
            accelerator = trainer.accelerator
            world, rank = accelerator.num_processes, accelerator.process_index
            logs = trainer._logs
            chunk = slice(-world * n + rank * n, -world * n + (rank + 1) * n or None)
            columns = [logs["prompt"], logs["completion"], logs["advantages"]]
            names = list(trainer.reward_func_names)  # in the order of reward_weights
            columns += [logs["rewards"][name] for name in names]
            if any(len(c) < world * n for c in columns):
                raise ValueError(f"TRL kept fewer than the {world * n} rows just generated")
            own = rows(
                list(logs["prompt"])[chunk],
                list(logs["completion"])[chunk],
                {name: list(logs["rewards"][name])[chunk] for name in names},
                trainer.reward_weights.tolist(),  # a CPU tensor of a few numbers
                list(logs["advantages"])[chunk],
            )
            self.producer.log(
                {self.name: Samples(own, key=KEY)}, step=trainer.state.global_step + 1
            )
            self._counts["samples_logged"] += 1
        except Exception as exc:  # never into the training step
            self._counts["samples_failed"] += 1
            if not self._warned:
                self._warned = True
                log.warning("rlpulse: completions of a generation not logged as samples: %r", exc)
