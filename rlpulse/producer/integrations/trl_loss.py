"""TRL: the loss metrics of every training micro-batch, exact, from every process, with no
change to the user's trainer.

TRL's ``GRPOTrainer`` logs ``entropy``, ``kl`` and ``clip_ratio/*_mean`` as, per micro-batch,
a (sum, count) pair reduced across processes, then averages those per-micro-batch means over
the logging window: a mean of means as soon as micro-batches hold different token counts.
Its ``loss`` is the Trainer's, each process's micro-batch losses averaged over processes.

:class:`LossHook` attaches to one trainer object (``RlpulseCallback`` does it when training
begins) and, for every training micro-batch on every process, logs those metrics as mergeable
states under TRL's names, for the optimizer step being computed:

* ``entropy``, ``kl`` (and ``vespo/phi_seq_mean``): ``Weighted(sum / count, count)``, read from
  the very ``(sum, count)`` pair TRL hands to ``accelerator.reduce`` (the hook reads the pair
  and passes it on unchanged: no collective, no copy to the host, no ``.item()`` of its own);
* ``clip_ratio/{low,high,region}_mean`` (``cispo_clip_ratio``): ``Fraction(clipped, count)``;
* ``loss``: the micro-batch's loss, from the tensor ``compute_loss`` returns, un-scaled for
  gradient accumulation and weighted as TRL's ``loss_type`` weights it: over tokens
  (``dapo``, ``bnpo``, ``cispo``, ``vespo``) or over sequences (``grpo``, ``sapo``,
  ``luspo``, ``dr_grpo``; ``RLOOTrainer``'s sequence loss). Not sent (TRL's own value stays)
  when an entropy bonus or a router auxiliary loss is part of the loss.

The collector pools them over every micro-batch and process of the step. Which reduce calls
carry which metric is TRL's code, so the hook is pinned to the TRL versions it was tested
with (:data:`TESTED_TRL`); on another, :meth:`LossHook.for_trainer` fails naming the version
(``RlpulseCallback`` calls it in ``on_train_begin``, so ``train()`` stops before any step).
``clip_ratio/low_min`` and ``clip_ratio/high_max`` stay TRL's values (window means of
per-micro-batch extremes).

>>> # hook = LossHook.for_trainer(trainer); hook.attach(trainer, producer) ... hook.detach()
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlpulse.producer.values import Fraction, Weighted
from rlpulse.schemas import frameworks as F
from rlpulse.schemas.errors import ConfigError

log = logging.getLogger("rlpulse.integrations.trl")

TESTED_TRL = ("1.16",)
"""TRL versions (major.minor) whose ``_compute_loss`` this hook was checked against."""

# TRL's names (rlpulse.schemas.frameworks)
LOSS = F.TRL_LOSS
ENTROPY = F.TRL_ENTROPY
KL = F.TRL_KL
CLIP_LOW = F.TRL_CLIP_LOW
CLIP_HIGH = F.TRL_CLIP_HIGH
CLIP_REGION = F.TRL_CLIP_REGION
CISPO_CLIP = F.TRL_CISPO_CLIP
VESPO_PHI = F.TRL_VESPO_PHI
MEAN, FRACTION = "mean", "fraction"

_TOKEN_LOSSES = {"bnpo", "dapo", "cispo", "vespo"}
_SEQUENCE_LOSSES = {"grpo", "sapo", "luspo", "dr_grpo"}


def check_version(version: str) -> None:
    """ConfigError naming ``version`` unless its major.minor is one of :data:`TESTED_TRL`."""
    if ".".join(version.split(".")[:2]) not in TESTED_TRL:
        raise ConfigError(
            "RlpulseCallback(exact=True)",
            f"TRL {version} is not a version the exact loss hook was tested with "
            f"({', '.join(TESTED_TRL)}); pass exact=False to send TRL's own values",
            version,
        )


@dataclass(frozen=True)
class LossHook:
    """What one trainer's micro-batches log: ``reduced`` names TRL's trailing
    ``accelerator.reduce`` calls in ``_compute_loss``, in order, with their reduction;
    ``loss`` is how the returned loss is weighted (``"tokens"``, ``"sequences"``) or None.

    >>> LossHook((("entropy", "mean"),), "sequences").reductions()
    {'entropy': 'mean', 'loss': 'mean'}
    """

    reduced: tuple[tuple[str, str], ...]
    loss: str | None
    loss_scaled: bool = True
    """Whether ``compute_loss`` already divided its loss by the accumulation steps (GRPO)."""

    @classmethod
    def for_trainer(cls, trainer: Any) -> LossHook | None:
        """The hook for ``trainer``, or None for a trainer it does not know (SFT, DPO...)."""
        try:
            import trl
        except ImportError:  # a transformers Trainer without TRL: nothing to hook
            return None
        rloo = getattr(trl, "RLOOTrainer", None)
        if not isinstance(trainer, trl.GRPOTrainer) and not (rloo and isinstance(trainer, rloo)):
            return None
        check_version(trl.__version__)  # which reduce call is which metric is TRL's code
        extra_terms = bool(getattr(trainer, "aux_loss_enabled", False))
        if isinstance(trainer, trl.GRPOTrainer):
            loss_type = trainer.loss_type
            reduced: list[tuple[str, str]] = [(KL, MEAN)] if trainer.beta != 0.0 else []
            reduced.append((ENTROPY, MEAN))
            if loss_type in {"grpo", "bnpo", "dr_grpo", "dapo", "luspo"}:
                reduced += [(CLIP_LOW, FRACTION), (CLIP_HIGH, FRACTION), (CLIP_REGION, FRACTION)]
            elif loss_type == "cispo":
                reduced.append((CISPO_CLIP, FRACTION))
            elif loss_type == "vespo":
                reduced.append((VESPO_PHI, MEAN))
            extra_terms |= bool(getattr(trainer, "_entropy_bonus_enabled", False))
            weight: str | None = "tokens" if loss_type in _TOKEN_LOSSES else "sequences"
            if loss_type not in _TOKEN_LOSSES | _SEQUENCE_LOSSES:
                weight = None
            return cls(tuple(reduced), None if extra_terms else weight)
        # RLOO: its kl is reduced while generating, not in the loss, so TRL's value stays.
        return cls(((ENTROPY, MEAN),), None if extra_terms else "sequences", False)

    def reductions(self) -> dict[str, str]:
        """The names this hook logs and their reductions (for the producer to declare)."""
        out = dict(self.reduced)
        if self.loss is not None:
            out[LOSS] = MEAN
        return out

    def names(self) -> tuple[str, ...]:
        return tuple(self.reductions())

    def attach(
        self, trainer: Any, producer: Any, on_mismatch: Callable[[str], None] | None = None
    ) -> Callable[[], None]:
        """Wrap ``trainer.compute_loss`` and ``trainer.accelerator.reduce`` on the instance
        (the class is untouched); returns the function that undoes it. ``on_mismatch`` is told,
        once, if a micro-batch makes fewer reduce calls than expected (the hook then stops)."""
        accelerator = trainer.accelerator
        original_loss, original_reduce = trainer.compute_loss, accelerator.reduce
        captured: list[Any] | None = None
        failed = False

        def reduce(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            if captured is not None:
                captured.append(tensor)  # TRL's own (sum, count) pair, reduced below as ever
            return original_reduce(tensor, *args, **kwargs)

        def compute_loss(model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
            nonlocal captured, failed
            if failed or not model.training:
                return original_loss(model, inputs, *args, **kwargs)
            captured = []
            try:
                loss = original_loss(model, inputs, *args, **kwargs)
            finally:
                pairs, captured = captured, None
            if len(pairs) < len(self.reduced):
                failed = True
                message = (
                    f"a micro-batch made {len(pairs)} accelerator.reduce calls, "
                    f"{len(self.reduced)} expected: this TRL does not compute its loss "
                    "metrics as the exact hook expects; TRL's own values are sent instead"
                )
                log.error("rlpulse: %s", message)
                if on_mismatch is not None:
                    on_mismatch(message)
                return loss
            try:
                self._log(trainer, producer, inputs, loss, pairs[len(pairs) - len(self.reduced) :])
            except Exception as exc:  # never into the training step
                log.warning("rlpulse: exact loss metrics of a micro-batch skipped: %r", exc)
            return loss

        trainer.compute_loss = compute_loss
        accelerator.reduce = reduce

        def detach() -> None:
            trainer.__dict__.pop("compute_loss", None)
            accelerator.__dict__.pop("reduce", None)

        return detach

    def _log(self, trainer: Any, producer: Any, inputs: Any, loss: Any, pairs: list[Any]) -> None:
        data: dict[str, Any] = {}
        for (name, reduction), pair in zip(self.reduced, pairs, strict=True):
            pair = pair.detach()
            total, count = pair[0], pair[1]
            if reduction == FRACTION:
                data[name] = Fraction(total, count)
            else:  # a mean over count tokens (or sequences), as TRL's global_masked_mean
                data[name] = Weighted(total / count.clamp(min=1.0), count)
        if self.loss is not None:
            data[LOSS] = self._loss_state(trainer, inputs, loss.detach())
        producer.log(data, step=trainer.state.global_step + 1)  # the step being computed

    def _loss_state(self, trainer: Any, inputs: Any, loss: Any) -> Weighted:
        """The micro-batch's loss as TRL defines it, before the accumulation scaling, with the
        weight its ``loss_type`` pools it by (mirrors ``GRPOTrainer._compute_loss``)."""
        accumulation = trainer.current_gradient_accumulation_steps if self.loss_scaled else 1
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        if self.loss == "sequences":
            return Weighted(loss * accumulation, mask.shape[0])
        tokens = mask.sum()
        if trainer.loss_type == "bnpo":
            return Weighted(loss * accumulation, tokens)
        # dapo, cispo, vespo: the token sum over num_items_in_batch rescaled to one window.
        normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / trainer.accelerator.num_processes
        normalizer = normalizer * accumulation / trainer.args.steps_per_generation
        return Weighted(loss * normalizer / tokens.clamp(min=1.0), tokens)
