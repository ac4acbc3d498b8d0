"""The example GRPO job (``examples/trl/grpo.py``) with a record of what each process trained
on, for ``test_trl`` and the overhead benchmark. Run as a script (under ``torchrun``):
``grpo_job.py OUT_DIR RUN [test|off|driver|on] [STEPS]``."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]


def load_example() -> ModuleType:
    """``examples/trl/grpo.py`` as a module (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location(
        "rlpulse_trl_example", ROOT / "examples/trl/grpo.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def truth(trainer: Any, inputs: dict[str, Any], logps: Any, entropies: Any) -> dict[str, Any]:
    """One micro-batch's token sums and counts, recomputed here in float64 from the model's
    log-probabilities and entropies and the batch (GRPO's clipped objective, ``beta=0``),
    independently of the values rlpulse sends: ``{name: [sum, count]}``."""
    mask = inputs["completion_mask"].double()
    logps = logps.detach().double()
    old = inputs.get("old_per_token_logps")
    old = logps if old is None else old.double()
    adv = inputs["advantages"].double().reshape(len(mask), -1)
    ratio = torch.exp(logps - old)
    clipped = torch.clamp(ratio, 1 - trainer.epsilon_low, 1 + trainer.epsilon_high)
    per_token_loss = -torch.min(ratio * adv, clipped * adv)
    low = ((ratio < 1 - trainer.epsilon_low) & (adv < 0)).double()
    high = ((ratio > 1 + trainer.epsilon_high) & (adv > 0)).double()
    tokens = mask.sum().item()
    return {
        name: [(values * mask).sum().item(), tokens]
        for name, values in {
            "loss": per_token_loss,
            "entropy": entropies.detach().double(),
            "clip_ratio/low_mean": low,
            "clip_ratio/high_mean": high,
            "clip_ratio/region_mean": torch.maximum(low, high),
        }.items()
    }


def recording(trainer_class: type) -> type:
    """``trainer_class`` that also keeps, per training micro-batch, its step, the advantages
    of its valid tokens, its completions' lengths and the :func:`truth` of its loss metrics
    (in ``self.seen``)."""

    class Recording(trainer_class):  # type: ignore[misc, valid-type]
        seen: list[dict[str, Any]]
        _forwards: list[Any] | None = None

        def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> Any:
            out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
            if self._forwards is not None:
                self._forwards.append(out)
            return out

        def compute_loss(
            self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any
        ) -> Any:
            if not model.training:
                return super().compute_loss(model, inputs, *args, **kwargs)
            self._forwards = []
            try:
                loss = super().compute_loss(model, inputs, *args, **kwargs)
            finally:
                (forward,), self._forwards = self._forwards, None
            mask = inputs["completion_mask"]
            adv = inputs["advantages"].reshape(len(mask), -1).expand_as(mask)
            self.seen.append(
                {
                    "step": self.state.global_step + 1,
                    "advantages": adv[mask.bool()].tolist(),
                    "lengths": mask.sum(1).tolist(),
                    "truth": truth(self, inputs, forward[0], forward[1]),
                }
            )
            return loss

    return Recording


PROOF = {"init_std": 0.5, "learning_rate": 0.05, "steps_per_generation": 4}
"""A policy that moves within a generation batch (two optimizer steps per generation), with
varied next-token distributions: clip ratios and entropies that differ across micro-batches."""


def main(out_dir: str, run: str, mode: str = "test", steps: int = 4) -> None:
    """``test``: the example's trainer, recorded, with the callback; ``off``, ``driver``,
    ``on``: TRL's own ``GRPOTrainer`` with no callback, ``RlpulseCallback(exact=False)`` (TRL's
    values only) and ``RlpulseCallback()`` (the benchmark's three)."""
    example = load_example()
    output_dir = str(Path(out_dir) / f"trainer-{mode}")
    settings = dict(PROOF)
    init_std = settings.pop("init_std")
    if mode == "test":
        trainer = example.make_trainer(
            example.RlpulseCallback(run=run),
            output_dir,
            steps=steps,
            trainer_class=recording(example.ExactGRPOTrainer),
            init_std=init_std,
            **settings,
        )
    else:
        callbacks = {
            "off": lambda run: [],
            "driver": lambda run: [example.RlpulseCallback(run=run, exact=False)],
            "on": lambda run: [example.RlpulseCallback(run=run)],
        }
        tokenizer = example.build_tokenizer()
        trainer = example.GRPOTrainer(
            model=example.tiny_model(tokenizer, init_std=init_std),
            reward_funcs=example.reward_length,
            args=example.grpo_config(output_dir, steps, **settings),
            train_dataset=example.prompts(),
            processing_class=tokenizer,
            callbacks=callbacks[mode](run),
        )
    trainer.seen = []
    trainer.train()
    args = trainer.args
    record = {
        "world_size": args.world_size,
        "log_history": trainer.state.log_history,
        "seen": trainer.seen,
    }
    (Path(out_dir) / f"{mode}-rank{args.process_index}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *sys.argv[3:4], *[int(a) for a in sys.argv[4:5]])
