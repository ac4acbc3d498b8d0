"""The example GRPO job (``examples/trl/grpo.py``) with a record of what each process trained
on, for ``test_trl``. Run as a script (under ``torchrun``): ``grpo_job.py OUT_DIR RUN``."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

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


def recording(trainer_class: type) -> type:
    """``trainer_class`` that also keeps, per training micro-batch, its step, the advantages
    of its valid tokens and its completions' lengths (in ``self.seen``)."""

    class Recording(trainer_class):  # type: ignore[misc, valid-type]
        seen: list[dict[str, Any]]

        def compute_loss(
            self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any
        ) -> Any:
            if model.training:
                mask = inputs["completion_mask"]
                adv = inputs["advantages"].reshape(len(mask), -1).expand_as(mask)
                self.seen.append(
                    {
                        "step": self.state.global_step + 1,
                        "advantages": adv[mask.bool()].tolist(),
                        "lengths": mask.sum(1).tolist(),
                    }
                )
            return super().compute_loss(model, inputs, *args, **kwargs)

    return Recording


def main(out_dir: str, run: str) -> None:
    example = load_example()
    trainer = example.make_trainer(
        example.RlpulseCallback(run=run),
        str(Path(out_dir) / "trainer"),
        steps=3,
        trainer_class=recording(example.ExactGRPOTrainer),
    )
    trainer.seen = []
    trainer.train()
    args = trainer.args
    record = {
        "world_size": args.world_size,
        "log_history": trainer.state.log_history,
        "seen": trainer.seen,
    }
    (Path(out_dir) / f"rank{args.process_index}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
